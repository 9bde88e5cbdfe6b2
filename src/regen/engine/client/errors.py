"""The failure taxonomy: every failed attempt gets exactly one class."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from regen.errors import EndpointError

FAILURE_CLASSES = (
    "rate_limited",
    "overloaded",
    "server",
    "timeout",
    "stalled",
    "connection",
    "tls",
    "redirect",
    "bad_request",
    "auth",
    "insufficient_credits",
    "moderation",
    "truncated",
    "invalid_response",
    "oversized_answer",
    "excluded_provider",
)
# An oversized answer is retried like a server error: the next attempt may reach a sound
# server (or provider), and max_attempts bounds what a broken one costs.
RETRYABLE = frozenset(
    {
        "rate_limited",
        "overloaded",
        "server",
        "timeout",
        "stalled",
        "connection",
        "invalid_response",
        "oversized_answer",
    }
)
# These end the whole run: no other request can succeed either (a refused redirect is the
# endpoint's setting, not the item's: see client/redirects.py).
STOPS_RUN = frozenset({"auth", "insufficient_credits", "tls", "redirect"})

ANSWER_BYTES_PER_TOKEN = 4096
"""The most bytes of an answer's body one token of its max_tokens may account for, about twice
the worst case: a token's text is at most 128 bytes (Qwen's and DeepSeek's vocabularies),
JSON escapes make a byte up to six (`\\u0001`), OpenRouter sends reasoning twice (`reasoning`
and `reasoning_details`), and a stream wraps each token in a chunk of its own (id, model,
provider, choice: about 400 bytes). An honest answer comes to 4-10 bytes a token (a few
hundred streamed): a body past this bound is not what max_tokens allowed."""
ANSWER_ENVELOPE_BYTES = 256 * 1024
"""Room besides the tokens: ids, usage, provider fields, and OpenRouter's whitespace padding
and keep-alive comments while a long answer waits."""
PROMPT_ID_BYTES = 12
"""Per byte of the request, room for the prompt's token ids that vLLM and SGLang send back
(`return_token_ids`): a prompt has no more tokens than its request has bytes, and an id takes
at most 11 bytes of JSON."""
LOGPROB_BYTES = 160
"""Per token and per alternative, room for logprobs asked for in `extra_body` (the token's
text, its logprob and its bytes)."""
UNSTATED_MAX_TOKENS = 131_072
"""The max_tokens assumed for a body that states none (regen's own always do)."""
ERROR_BODY_BYTES = 64 * 1024
"""How much of an error status's body is read: its message is cut to a few hundred bytes."""
RETRY_AFTER_MAX_S = 3600.0
"""The longest wait a server's Retry-After may impose before an item is tried again."""


def answer_bound(body: Mapping[str, Any], request_bytes: int) -> int:
    """The most bytes an answer to this request body can take (whole or streamed): beyond
    it, the answer is `oversized_answer` and is read no further."""
    stated = [
        v
        for v in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    ]
    max_tokens = max(stated) if stated else UNSTATED_MAX_TOKENS
    per_token = ANSWER_BYTES_PER_TOKEN
    if body.get("logprobs"):
        top = body.get("top_logprobs")
        alternatives = top if isinstance(top, int) and not isinstance(top, bool) else 0
        per_token += LOGPROB_BYTES * (max(0, alternatives) + 1)
    asks_ids = bool(body.get("return_token_ids") or body.get("return_prompt_token_ids"))
    prompt_ids = PROMPT_ID_BYTES * request_bytes if asks_ids else 0
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    return ANSWER_ENVELOPE_BYTES + prompt_ids + choices * max_tokens * per_token


def oversized(limit: int, body: Mapping[str, Any]) -> EndpointError:
    """The error of an answer that passed `answer_bound`, in one line with the next step."""
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    return EndpointError(
        "oversized_answer",
        f"the answer passed {limit:,} bytes, more than max_tokens = {max_tokens} can make "
        f"({ANSWER_BYTES_PER_TOKEN} bytes a token at most); it was not read further: check "
        "the server at [endpoint].base_url",
        status=200,
    )


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]+")


def brief(value: Any, limit: int = 500) -> str:
    """A server's value as one line of at most `limit` characters, whatever its type or
    depth (repr() of a deeply nested list raises RecursionError). Control characters become
    a space: a message is printed on terminals (an escape sequence would act there) and in
    logs, one line each."""
    if isinstance(value, str):
        text = value[: limit * 2]
    else:
        try:
            text = orjson.dumps(value).decode()[: limit * 2]
        except (orjson.JSONEncodeError, TypeError):
            return f"a {type(value).__name__}"
    return _CONTROLS.sub(" ", text)[:limit]


def class_of_status(status: int, message: str = "") -> str:
    """The class of an HTTP error status (also used for `error.code` inside a 200 body)."""
    if status == 401:
        return "auth"
    if status == 402:
        return "insufficient_credits"
    if status == 403:
        return "auth" if "key" in message.lower() else "moderation"
    if status in (408, 524):
        return "timeout"
    if status == 429:
        return "rate_limited"
    if status in (503, 529):
        return "overloaded"
    if status >= 500:
        return "server"
    return "bad_request"


def looks_like_html(raw: bytes) -> bool:
    """A body that is a web page (a proxy's error page, a site at the wrong base URL)."""
    head = raw[:200].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return seconds(float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds(when - (time.time() if now is None else now))


def seconds(value: float) -> float | None:
    """A server's wait in seconds, within 0 and RETRY_AFTER_MAX_S (None: not a number)."""
    if math.isnan(value):
        return None
    return min(RETRY_AFTER_MAX_S, max(0.0, value))


def error_from_body(
    error: Any, *, status: int | None, retry_after_s: float | None = None
) -> EndpointError:
    """An EndpointError from an OpenAI/OpenRouter `error` object (top-level or in a choice)."""
    if not isinstance(error, dict):
        return EndpointError(
            "invalid_response", f"error field is {brief(error, 200)}", status=status
        )
    message = brief(error.get("message") or "no message")
    code = error.get("code")
    try:
        code_int = int(code) if code is not None else None
    except (TypeError, ValueError):
        code_int = None
    # Only an HTTP error status stands for the status (it is stored as one: 1e30 would not fit).
    effective = code_int if code_int is not None and 400 <= code_int <= 599 else status
    cls = class_of_status(effective, message) if effective and effective >= 400 else "server"
    availability = error.get("availability")
    if isinstance(availability, dict):
        ra = availability.get("retry_after")
        if isinstance(ra, int | float) and not isinstance(ra, bool) and retry_after_s is None:
            retry_after_s = seconds(float(ra))
        if availability.get("retryable") is False and cls in RETRYABLE:
            cls = "bad_request"
    return EndpointError(cls, message, status=effective, retry_after_s=retry_after_s)
