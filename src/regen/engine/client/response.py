"""Parse an OpenAI-compatible chat completion body into a Result, or raise its EndpointError."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any

import orjson

from regen.conversation import Message, Result, ToolCall, Usage
from regen.engine.client.errors import error_from_body, looks_like_html
from regen.engine.gate import amount, shown
from regen.errors import EndpointError

REPLACEMENT = "\ufffd"
"""What stands in for a code point that cannot be stored as text: a lone UTF-16 surrogate
(`"\\ud800"`: valid JSON, but half of a UTF-16 pair and no character) or bytes that are not
UTF-8. U+FFFD rather than the escape as visible text: it is what every UTF-8 decoder writes
for bytes it cannot read, it takes one character where the model wrote one (an escape is six,
and would throw the text's length off its billed tokens), and it cannot be taken for text the
model meant (a model may well write `\\ud800` about JSON). `regen audit` flags answers that
hold it (`replacement_character`)."""
_ESCAPES = re.compile(
    rb"\\\\"  # an escaped backslash: what follows it is not an escape
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"  # a lone surrogate
)
MAX_COUNT = 2**32
"""Token counts are capped here (SQLite's integers hold 64 bits; a count past 4e9 is no count)."""


def loads_answer(raw: bytes) -> Any:
    """JSON from a server, with what cannot be stored as text replaced by U+FFFD (REPLACEMENT),
    and the bare NaN and Infinity that Python's json (and proxies written with it) put in
    numbers read as floats: an answer is not lost to one number (the gate judges numbers).
    Raises orjson.JSONDecodeError when it is not JSON either way."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        repaired = _repaired(raw)
        if repaired is not None:
            try:
                return orjson.loads(repaired)
            except orjson.JSONDecodeError:
                pass
        if b"NaN" in raw or b"Infinity" in raw:
            try:
                return json.loads(repaired if repaired is not None else raw)
            except (ValueError, RecursionError):
                pass
        raise exc from None


def _repaired(raw: bytes) -> bytes | None:
    """The JSON text with its bytes that are not UTF-8 and its lone surrogate escapes replaced
    by U+FFFD; None when it holds neither."""
    try:
        raw.decode("utf-8")
        fixed = raw
    except UnicodeDecodeError:
        fixed = raw.decode("utf-8", "replace").encode("utf-8")
    if b"\\u" in fixed:

        def keep_or_replace(m: re.Match[bytes]) -> bytes:
            return m[0] if len(m[0]) != 6 else b"\\ufffd"

        fixed = _ESCAPES.sub(keep_or_replace, fixed)
    return None if fixed == raw else fixed


def parse_chat_body(item_id: str, raw: bytes, *, status: int, latency_s: float) -> Result:
    """The Result of a 200 response body.

    OpenRouter pads non-streaming bodies with leading whitespace and reports late errors as
    HTTP 200 with an `error` object, so both are handled here rather than trusted to the status.
    A code point that cannot be stored as text is kept as U+FFFD (REPLACEMENT), not refused:
    the answer was billed, and a retry would be billed again.
    """
    try:
        body = loads_answer(raw.strip())
    except orjson.JSONDecodeError as exc:
        if looks_like_html(raw):
            raise EndpointError(
                "invalid_response",
                "the server answered an HTML page, not JSON (is [endpoint].base_url the "
                "API's, ending in /api/v1 or /v1?)",
                status=status,
            ) from exc
        raise EndpointError("invalid_response", f"body is not JSON: {exc}", status=status) from exc
    return result_from_body(item_id, body, status=status, latency_s=latency_s)


def result_from_body(item_id: str, body: Any, *, status: int, latency_s: float) -> Result:
    """The Result of a parsed chat completion (also an assembled stream), or its error."""
    if not isinstance(body, dict):
        raise EndpointError("invalid_response", "body is not a JSON object", status=status)
    if body.get("error") is not None:
        err = error_from_body(body["error"], status=status)
        err.unbilled = True
        raise err
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError("invalid_response", "no choices in response", status=status)
    choice = choices[0]
    if choice.get("error") is not None:
        raise error_from_body(choice["error"], status=status)
    finish_reason = choice.get("finish_reason")
    if finish_reason == "error":
        raise EndpointError("server", "generation ended with finish_reason 'error'", status=status)
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise EndpointError("invalid_response", "choice has no message", status=status)
    message = _message(msg, status)
    usage = _usage(body.get("usage"))
    if not message.content and not message.tool_calls and not message.reasoning:
        # Cold starts answer with nothing; OpenRouter's advice is to retry.
        raise EndpointError("invalid_response", "empty response", status=status)
    return Result(
        item_id=item_id,
        message=message,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=usage,
        provider=_str_or_none(body.get("provider")),
        model=_str_or_none(body.get("model")),
        generation_id=_str_or_none(body.get("id")),
        latency_s=latency_s,
        # vLLM puts the prompt's ids on the response, SGLang on the choice.
        prompt_token_ids=_ids(body.get("prompt_token_ids", choice.get("prompt_token_ids"))),
        completion_token_ids=_ids(choice.get("token_ids")),
    )


N_IGNORED = "asked for several choices (n), the server answered another number: does it take n?"
"""The error of each choice missing from an answer for n choices."""


def parse_choices(
    item_ids: list[str], raw: bytes, *, latency_s: float
) -> list[Result | EndpointError]:
    """The Results of a 200 body of len(item_ids) choices (choice k for item k), or each
    choice's error. A body that is no answer at all raises, as parse_chat_body does."""
    try:
        body = loads_answer(raw.strip())
    except orjson.JSONDecodeError:
        parse_chat_body(item_ids[0], raw, status=200, latency_s=latency_s)  # raises its error
        raise
    if not isinstance(body, dict) or body.get("error") is not None:
        result_from_body(item_ids[0], body, status=200, latency_s=latency_s)  # raises
    out: list[Result | EndpointError] = []
    for item, one in zip(item_ids, choice_bodies(body, len(item_ids)), strict=True):
        if one is None:
            out.append(EndpointError("invalid_response", N_IGNORED, status=200))
            continue
        try:
            out.append(result_from_body(item, one, status=200, latency_s=latency_s))
        except EndpointError as exc:
            out.append(exc)
    return out


def choice_bodies(body: Any, n: int) -> list[Any]:
    """A body of `n` choices (vLLM's and SGLang's `n`: one prefill, n generations) as n bodies
    of one choice each, for result_from_body. Each choice's usage is its own share of the
    bill: its own completion (its token ids where the server returned them, else the usage's
    completion split in proportion to the text) and an equal share of the one prompt (the
    first choices take the remainder), so that the shares add up to the usage billed. A body
    that is not n choices is given back as it is for choice 0 (its error or shape is raised by
    result_from_body), and the other choices are None."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != n or body.get("error") is not None:
        return [body, *([None] * (n - 1))]
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    total = _usage(usage)
    lengths = []
    for c in choices:
        ids = _ids(c.get("token_ids")) if isinstance(c, dict) else None
        msg = c.get("message") if isinstance(c, dict) else None
        text = json.dumps(msg, ensure_ascii=False) if isinstance(msg, dict) else ""
        lengths.append((ids, len(text)))
    known = all(ids is not None for ids, _ in lengths)
    chars = sum(size for _, size in lengths) or 1
    out = []
    given = 0
    for k, (c, (ids, size)) in enumerate(zip(choices, lengths, strict=True)):
        if known and ids is not None:
            completion = len(ids)
        elif k == n - 1:
            completion = max(0, total.completion_tokens - given)
        else:
            completion = total.completion_tokens * size // chars
        given += completion
        prompt = _share(total.prompt_tokens, n, k)
        start = sum(_share(total.prompt_tokens, n, j) for j in range(k))
        reasoning = total.reasoning_tokens * completion // max(1, total.completion_tokens)
        share: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "reasoning_tokens": reasoning,
            "prompt_tokens_details": _cache_share(total, start, prompt),
        }
        for name in BILLED_FIELDS:  # a share of a junk bill is junk: the gate judges it
            if any(j.startswith(f"{name} = ") for j in total.junk):
                share[name] = usage[name]
        if any(j.startswith("prompt_tokens_details.") for j in total.junk) or (
            total.cached_tokens + total.cache_write_tokens > total.prompt_tokens
        ):  # cache counts that are no amounts, or more than the prompt: the gate judges them
            share["prompt_tokens_details"] = usage.get("prompt_tokens_details")
        if total.cost_usd is not None:
            share["cost"] = (
                total.cost_usd
                * (prompt + completion)
                / max(1, total.prompt_tokens + total.completion_tokens)
            )
        out.append({**body, "choices": [c], "usage": share})
    return out


def _share(total: int, n: int, k: int) -> int:
    """Choice k's equal share of `total` over n choices (the first take the remainder)."""
    return total // n + (1 if k < total % n else 0)


def _cache_share(total: Usage, start: int, size: int) -> dict[str, int]:
    """The cache use of a choice's share of one prompt's tokens, [start, start + size): the
    prompt's tokens laid out as its cached ones, then its written ones, then the rest, so
    that the shares add up to the whole and none claims more than its own prompt share."""
    cached, written = total.cached_tokens, total.cache_write_tokens

    def overlap(lo: int, hi: int) -> int:
        return max(0, min(hi, start + size) - max(lo, start))

    return {
        "cached_tokens": overlap(0, cached),
        "cache_write_tokens": overlap(cached, cached + written),
    }


def counted_usage(result: Result, prompt_tokens_est: int) -> Result:
    """An answer with text never counts 0 tokens. A server that sent no usage (a stream
    without `stream_options.include_usage`, a proxy that drops it) is counted from the token
    ids it returned, else estimated (about 4 bytes a token for the answer; the item's own
    estimate for the prompt), and the usage says which (`source`)."""
    u, m = result.usage, result.message
    has_text = bool(m.content or m.reasoning or m.tool_calls)
    if not has_text or (u.completion_tokens > 0 and u.prompt_tokens > 0):
        return result
    source = "ids"
    completion, prompt = u.completion_tokens, u.prompt_tokens
    if completion <= 0:
        if result.completion_token_ids:
            completion = len(result.completion_token_ids)
        else:
            text = (m.reasoning or "") + m.content
            text += "".join(c.name + c.arguments for c in m.tool_calls)
            completion, source = max(1, round(len(text.encode()) / 4)), "estimate"
    if prompt <= 0:
        if result.prompt_token_ids:
            prompt = len(result.prompt_token_ids)
        else:
            prompt, source = max(1, prompt_tokens_est), "estimate"
    return replace(
        result,
        usage=replace(u, prompt_tokens=prompt, completion_tokens=completion, source=source),
    )


def _message(msg: dict[str, Any], status: int) -> Message:
    content = msg.get("content")
    # vLLM and OpenRouter say `reasoning`; SGLang and older vLLM `reasoning_content`.
    reasoning = msg.get("reasoning")
    if reasoning is None:
        reasoning = msg.get("reasoning_content")
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list) or not all(_is_call(c) for c in raw_calls):
        raise EndpointError("invalid_response", "malformed tool_calls", status=status)
    if content is not None and not isinstance(content, str):
        raise EndpointError("invalid_response", "content is not a string", status=status)
    if reasoning is not None and not isinstance(reasoning, str):
        raise EndpointError("invalid_response", "reasoning is not a string", status=status)
    return Message(
        role="assistant",
        content=content or "",
        reasoning=reasoning or None,
        tool_calls=tuple(_call(c, status) for c in raw_calls),
    )


def _is_call(c: Any) -> bool:
    fn = c.get("function") if isinstance(c, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and bool(fn["name"])


def _call(c: dict[str, Any], status: int) -> ToolCall:
    """A tool call as ToolCall.from_openai reads it, with arguments sent as a JSON value
    written back as text (a value too deep to write is an invalid answer)."""
    fn = c["function"]
    args = fn.get("arguments")
    if args is None:
        args = ""
    elif not isinstance(args, str):
        try:
            args = json.dumps(args, ensure_ascii=False)
        except (RecursionError, ValueError) as exc:
            raise EndpointError(
                "invalid_response", "tool call arguments nest too deep to write", status=status
            ) from exc
    call_id = c.get("id")
    if isinstance(call_id, int) and not isinstance(call_id, bool):
        call_id = str(call_id)
    return ToolCall(id=call_id if isinstance(call_id, str) else "", name=fn["name"], arguments=args)


BILLED_FIELDS = ("prompt_tokens", "completion_tokens", "cost")
CACHE_FIELDS = ("cached_tokens", "cache_write_tokens")
"""The fields of `usage.prompt_tokens_details` that move money (a cached token is billed at
the cache read price): one that is no amount is junk as well."""
"""The usage fields that move money: one that is sent but is no amount (negative, not finite,
past MAX_COUNT, text) is junk (`Usage.junk`), for the gate; one left out (or null) is
counted from ids, estimated or priced from the list, as before."""


def _usage(u: Any) -> Usage:
    if not isinstance(u, dict):
        return Usage()
    details = u.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if reasoning is None:
        reasoning = u.get("reasoning_tokens")  # SGLang puts it at the top level
    prompt = u.get("prompt_tokens_details")
    prompt = prompt if isinstance(prompt, dict) else {}
    junk = junk_fields(u, BILLED_FIELDS)
    cache = junk_fields(prompt, CACHE_FIELDS)
    return Usage(
        prompt_tokens=_int(u.get("prompt_tokens")),
        completion_tokens=_int(u.get("completion_tokens")),
        reasoning_tokens=_int(reasoning),
        # None (priced from the list, and junk for the gate) when it is no amount: a negative
        # cost would give the budget room it does not have.
        cost_usd=amount(u.get("cost")),
        junk=junk + tuple(f"prompt_tokens_details.{j}" for j in cache) if cache else junk,
        cached_tokens=_int(prompt.get("cached_tokens")),
        cache_write_tokens=_int(prompt.get("cache_write_tokens")),
    )


def junk_fields(record: dict[str, Any], names: tuple[str, ...]) -> tuple[str, ...]:
    """`name = value` for each of `names` that `record` holds but that is no amount: neither
    absent nor null, and not a finite number within 0 and MAX_COUNT."""
    out = []
    for name in names:
        value = record.get(name)
        # The common case first, without a call: a plain number in range (NaN fails the test).
        if value is None or (type(value) in (int, float) and 0 <= value <= MAX_COUNT):
            continue
        number = amount(value)
        if number is None or number > MAX_COUNT:
            out.append(f"{name} = {shown(value)}")
    return tuple(out)


def _ids(v: Any) -> tuple[int, ...] | None:
    """A list of token ids, or None when absent or not one (the answer stays usable). Ids are
    stored as uint32."""
    if not isinstance(v, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in v
    ):
        return None
    return tuple(v)


def _int(v: Any) -> int:
    """A token count within 0 and MAX_COUNT (anything else counts 0: counted_usage then
    estimates it)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return 0
    if isinstance(v, float) and not math.isfinite(v):
        return 0
    return min(MAX_COUNT, max(0, int(v)))


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None
