"""SSE chunks of a simulated completion, in OpenRouter's streaming shape."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from regen.sim.generate import Completion

_PIECE = re.compile(r"\s*\S+")


def pieces(text: str, words_per_piece: int) -> Iterator[str]:
    """The text cut into pieces of a few words that join back to exactly the text."""
    parts = _PIECE.findall(text)
    tail = text[len("".join(parts)) :]
    for i in range(0, len(parts), words_per_piece):
        chunk = "".join(parts[i : i + words_per_piece])
        if i + words_per_piece >= len(parts):
            chunk += tail
        yield chunk


def deltas(comp: Completion, words_per_piece: int, reasoning_shown: bool) -> list[dict[str, Any]]:
    """The `delta` objects of a completion, in order: reasoning, content, tool calls."""
    out: list[dict[str, Any]] = []
    if reasoning_shown:
        for p in pieces(comp.reasoning, words_per_piece):
            out.append(
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning": p,
                    "reasoning_details": [
                        {"type": "reasoning.text", "text": p, "format": "unknown", "index": 0}
                    ],
                }
            )
    for p in pieces(comp.content, words_per_piece):
        out.append({"role": "assistant", "content": p})
    for call in comp.tool_calls:
        idx = call["index"]
        fn = call["function"]
        out.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": idx,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ],
            }
        )
        args = fn["arguments"]
        for i in range(0, len(args), 12):
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": idx,
                            "type": "function",
                            "function": {"arguments": args[i : i + 12]},
                        }
                    ],
                }
            )
    return out


def chunk(meta: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        **meta,
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "native_finish_reason": finish,
                "logprobs": None,
            }
        ],
    }
