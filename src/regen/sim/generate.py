"""Deterministic completions: the same seed and request always give the same response.

A completion is the text the family's published chat template writes for the drawn answer
(chat.py), as token ids of the simulator's tokenizer, cut at max_tokens, and then parsed back
into reasoning, content and tool calls as a real server would.
`completion_tokens` is the number of those ids. Lengths depend on the prompt (longer and
'harder' prompts draw longer answers), so a job's datasets differ in cost and duration.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from regen.sim.chat import (
    ALWAYS_THINKS,
    CALLS_ALONE,
    TEXT_ARGUMENTS,
    WRITES_CALL_IDS,
    completion_text,
    render_prompt,
)
from regen.sim.grammar import Call, grammar, sim_tokenizer
from regen.sim.tokens import encode_prompt
from regen.sim.words import WORDS

_LONG_HINTS = ("code", "function", "prove", "step", "explain", "write", "implement", "derive")


@dataclass(frozen=True, slots=True)
class Completion:
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]
    reasoning_tokens: int
    completion_tokens: int
    finish_reason: str
    ids: list[int]


NOT_CONTENT = frozenset({"stream", "stream_options", "session_id", "prompt_cache_key"})


def request_digest(seed: int, body: dict[str, Any]) -> bytes:
    """What identifies a request's content: not how it is streamed, nor the routing keys a
    client may add (`session_id`, `prompt_cache_key`), which choose a provider, not an answer."""
    key = {k: v for k, v in body.items() if k not in NOT_CONTENT}
    return hashlib.blake2b(
        json.dumps([seed, key], sort_keys=True, default=str).encode(), digest_size=16
    ).digest()


def rng_for(digest: bytes, *salt: int) -> random.Random:
    h = hashlib.blake2b(digest + b"".join(s.to_bytes(8, "little") for s in salt), digest_size=16)
    return random.Random(int.from_bytes(h.digest(), "little"))


def prompt_token_ids(
    family: str, messages: list[Any], tools: list[Any], thinking: bool
) -> list[int]:
    """The prompt as the family's published template renders it, in the sim tokenizer's ids."""
    return encode_prompt()(render_prompt(family, messages, tools, thinking))


def count_prompt_tokens(family: str, messages: list[Any], tools: list[Any], thinking: bool) -> int:
    """Prompt tokens as the family's published template renders them, counted by the sim
    tokenizer."""
    return len(prompt_token_ids(family, messages, tools, thinking))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def _prompt_text(messages: list[Any]) -> str:
    return " ".join(
        m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


def draw_length(rng: random.Random, mean_tokens: float, messages: list[Any]) -> int:
    """Completion length from a log-normal whose mean grows with prompt length and hints."""
    text = _prompt_text(messages).lower()
    scale = 1.0 + min(2.0, len(text.split()) / 200)
    scale *= 1.0 + sum(0.4 for h in _LONG_HINTS if h in text)
    sigma = 0.6
    mu = math.log(mean_tokens * scale) - sigma**2 / 2
    return max(1, int(rng.lognormvariate(mu, sigma)))


def _is_text(spec: Any) -> bool:
    """Whether a property's schema holds text only: declared a string (or untyped), its enum's
    values (if any) all strings."""
    if not isinstance(spec, dict):
        return True
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        return all(isinstance(v, str) for v in enum)
    return spec.get("type") in (None, "string")


def _arguments(rng: random.Random, tool: dict[str, Any], text_only: bool = False) -> str:
    """Arguments that fit the tool's schema. `text_only`: only its text properties, and the
    required others (TEXT_ARGUMENTS)."""
    params = (tool.get("function") or {}).get("parameters") or {}
    return json.dumps(_object(rng, params if isinstance(params, dict) else {}, text_only))


def _object(rng: random.Random, schema: dict[str, Any], text_only: bool = False) -> dict[str, Any]:
    props = schema.get("properties")
    required = schema.get("required")
    needed = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    args: dict[str, Any] = {}
    for name, spec in (props if isinstance(props, dict) else {}).items():
        if text_only and not _is_text(spec) and name not in needed:
            continue
        args[name] = _value(rng, spec)
    return args


def _value(rng: random.Random, spec: Any, depth: int = 0) -> Any:
    """A value that fits a property's schema: its enum, its type (the first that is not null,
    of a list), within its bounds; arrays and objects by their own items and properties."""
    if not isinstance(spec, dict):
        return rng.choice(WORDS)
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return rng.choice(spec["enum"])
    if "const" in spec:
        return spec["const"]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "integer":
        return rng.randint(*_bounds(spec, 1, 100, integer=True))
    if kind == "number":
        lo, hi = _bounds(spec, 0, 100, integer=False)
        return round(rng.uniform(lo, hi), 2) if (lo, hi) == (0, 100) else (lo + hi) / 2
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array" and depth < 4:
        low = int(_number(spec.get("minItems")) or 1)
        high = int(_number(spec.get("maxItems")) or max(low, 3))
        return [_value(rng, spec.get("items"), depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "object" and depth < 4:
        return _object(rng, spec)
    return rng.choice(WORDS)


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bounds(spec: dict[str, Any], lo: float, hi: float, *, integer: bool) -> tuple[Any, Any]:
    """A number's range: the schema's minimum and maximum (exclusive ones one step in), else
    the default; an integer's as integers."""
    step = 1 if integer else 0.01
    low, high = _number(spec.get("minimum")), _number(spec.get("maximum"))
    # Draft 4's exclusive bounds are booleans on minimum and maximum; later drafts', numbers.
    if (ex := _number(spec.get("exclusiveMinimum"))) is not None or (
        spec.get("exclusiveMinimum") is True and (ex := low) is not None
    ):
        low = ex + step
    if (ex := _number(spec.get("exclusiveMaximum"))) is not None or (
        spec.get("exclusiveMaximum") is True and (ex := high) is not None
    ):
        high = ex - step
    low = low if low is not None else (lo if high is None or high >= lo else high)
    high = high if high is not None else max(hi, low)
    if integer:
        return math.ceil(low), max(math.ceil(low), math.floor(high))
    return low, max(low, high)


def generate(
    rng: random.Random,
    *,
    family: str,
    messages: list[Any],
    tools: list[Any] | None,
    max_tokens: int,
    mean_tokens: float,
    thinking: bool,
) -> Completion:
    g = grammar(family)
    thinking = thinking or family in ALWAYS_THINKS
    budget = draw_length(rng, mean_tokens, messages)
    n_reason = max(1, int(budget * rng.uniform(0.3, 0.7))) if thinking else 0
    n_content = max(1, budget - n_reason)
    callable_tools = [
        t
        for t in tools or []
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    calls: list[Call] = []
    if callable_tools and last.get("role") == "user" and rng.random() < 0.6:
        tool = rng.choice(callable_tools)
        args = _arguments(rng, tool, text_only=family in TEXT_ARGUMENTS)
        calls = [Call(tool["function"]["name"], args)]
        n_content = rng.choice((0, 0, min(n_content, 12)))  # a short preamble, sometimes
        if family in CALLS_ALONE:
            n_content = 0
    reasoning = _words(rng, n_reason)
    content = _words(rng, n_content)
    before = sum(
        len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict)
    )  # Kimi-K2 and K2.5 number their call ids over the conversation
    answer = {
        "role": "assistant",
        "content": content,
        "reasoning": reasoning,
        "tool_calls": [
            {
                "id": f"functions.{c.name}:{before + i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ],
    }
    text = completion_text(family, messages, tools or [], thinking, answer)
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
    cut = len(ids) > max_tokens
    ids = ids[:max_tokens]
    parsed = g.parse(ids, thinking, tools)
    finish = "length" if cut or not parsed.complete else ("tool_calls" if parsed.calls else "stop")
    tool_calls = [
        {
            "id": f"functions.{c.name}:{before + i}"
            if family in WRITES_CALL_IDS
            else f"call_{rng.getrandbits(64):016x}",
            "type": "function",
            "index": i,
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(parsed.calls)
    ]
    return Completion(
        parsed.reasoning, parsed.content, tool_calls, parsed.reasoning_tokens, len(ids), finish, ids
    )
