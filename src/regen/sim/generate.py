"""Deterministic completions: the same seed and request always give the same response.

Lengths depend on the prompt (longer and 'harder' prompts draw longer answers), so a job's
datasets differ in cost and duration the way real ones do.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

_WORDS = (
    "the",
    "model",
    "reads",
    "each",
    "step",
    "and",
    "then",
    "checks",
    "whether",
    "the",
    "answer",
    "holds",
    "for",
    "every",
    "case",
    "so",
    "we",
    "compute",
    "a",
    "value",
    "from",
    "input",
    "data",
    "result",
    "function",
    "list",
    "index",
    "loop",
    "sum",
    "check",
    "test",
    "first",
    "next",
    "last",
    "because",
    "therefore",
    "however",
    "note",
    "that",
    "this",
    "gives",
    "us",
    "a",
    "simple",
    "way",
    "to",
    "solve",
    "problem",
    "carefully",
    "consider",
    "edge",
    "cases",
    "return",
    "output",
    "string",
    "number",
    "array",
    "table",
    "user",
    "asks",
    "about",
    "weather",
    "code",
    "math",
    "proof",
    "query",
    "file",
    "line",
    "error",
    "fix",
    "update",
    "plan",
)

_LONG_HINTS = ("code", "function", "prove", "step", "explain", "write", "implement", "derive")


@dataclass(frozen=True, slots=True)
class Completion:
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]
    reasoning_tokens: int
    completion_tokens: int
    finish_reason: str


def request_rng(seed: int, body: dict[str, Any]) -> random.Random:
    """An rng keyed by the seed and the request's content (not by how it is streamed)."""
    key = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    digest = hashlib.blake2b(
        json.dumps([seed, key], sort_keys=True, default=str).encode(), digest_size=16
    ).digest()
    return random.Random(int.from_bytes(digest, "little"))


def count_prompt_tokens(messages: list[Any]) -> int:
    """A rough token count: words plus a few tokens of chat framing per message."""
    n = 0
    for m in messages:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, default=str)
            n += 4 + len(text.split())
    return n + 2


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


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


def _arguments(rng: random.Random, tool: dict[str, Any]) -> str:
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    args: dict[str, Any] = {}
    for name, spec in props.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind == "integer":
            args[name] = rng.randint(1, 100)
        elif kind == "number":
            args[name] = round(rng.uniform(0, 100), 2)
        elif kind == "boolean":
            args[name] = rng.random() < 0.5
        elif isinstance(spec, dict) and spec.get("enum"):
            args[name] = rng.choice(spec["enum"])
        else:
            args[name] = rng.choice(_WORDS)
    return json.dumps(args)


def generate(
    rng: random.Random,
    *,
    messages: list[Any],
    tools: list[Any] | None,
    max_tokens: int,
    mean_tokens: float,
    reasoning: bool,
) -> Completion:
    """Reasoning, then content or a tool call; cut at max_tokens with finish_reason 'length'."""
    budget = draw_length(rng, mean_tokens, messages)
    n_reason = int(budget * rng.uniform(0.3, 0.7)) if reasoning else 0
    n_content = max(1, budget - n_reason)
    callable_tools = [t for t in tools or [] if isinstance(t, dict) and t.get("function")]
    last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    wants_call = bool(callable_tools) and last_role == "user" and rng.random() < 0.6
    if n_reason >= max_tokens:
        return Completion(_words(rng, max_tokens), "", [], max_tokens, max_tokens, "length")
    room = max_tokens - n_reason
    reasoning_text = _words(rng, n_reason)
    if wants_call:
        tool = rng.choice(callable_tools)
        args = _arguments(rng, tool)
        call_tokens = 4 + len(args.split())
        if call_tokens <= room:
            call = {
                "id": f"call_{rng.getrandbits(64):016x}",
                "type": "function",
                "index": 0,
                "function": {"name": tool["function"]["name"], "arguments": args},
            }
            return Completion(
                reasoning_text, "", [call], n_reason, n_reason + call_tokens, "tool_calls"
            )
    if n_content > room:
        return Completion(reasoning_text, _words(rng, room), [], n_reason, max_tokens, "length")
    return Completion(
        reasoning_text, _words(rng, n_content), [], n_reason, n_reason + n_content, "stop"
    )
