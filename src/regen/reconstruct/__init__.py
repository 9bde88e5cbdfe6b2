"""Token-exact completions: each answer laid out in its model family's own grammar.

OpenRouter returns text (reasoning, content, tool calls), never ids. A drafter trains on the
target's ids, so the answer is written back the way the model produced it, and tokenized:

- `kimi-k2.5`: `<think>` is pre-filled by the prompt, so the completion is
  `{reasoning}</think>{content}[tool-call section]<|im_end|>`; a call is
  `<|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>` with ids
  `functions.{name}:{index}` and the arguments verbatim.
- `kimi-k2`: no thinking: `{content}[tool-call section]<|im_end|>`.
- `qwen3`: `<think>\\n{reasoning}\\n</think>\\n\\n{content}`, each call as
  `\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, then `<|im_end|>`.
- `chatml`: `{content}<|im_end|>` (the generic fallback).

An answer cut at max_tokens (`finish_reason == "length"`) has no end-of-turn token, and no
`</think>` when it was cut inside its reasoning. This module covers the completion side only:
prompt ids (the target's chat template) are not built yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from regen.errors import ConfigError

Call = dict[str, Any]
"""A tool call in OpenAI form: {"id", "type", "function": {"name", "arguments"}}."""


def _fn(call: Call) -> tuple[str, str]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    return str(fn.get("name") or ""), args if isinstance(args, str) else json.dumps(args)


def _kimi_section(calls: Sequence[Call]) -> str:
    if not calls:
        return ""
    parts = []
    for i, c in enumerate(calls):
        name, args = _fn(c)
        cid = c.get("id") or f"functions.{name}:{i}"
        parts.append(f"<|tool_call_begin|>{cid}<|tool_call_argument_begin|>{args}<|tool_call_end|>")
    return "<|tool_calls_section_begin|>" + "".join(parts) + "<|tool_calls_section_end|>"


def kimi_k25(reasoning: str, content: str, calls: Sequence[Call], truncated: bool) -> str:
    if truncated and not content and not calls:
        return reasoning  # cut inside the reasoning: no </think> yet
    text = f"{reasoning}</think>{content}{_kimi_section(calls)}"
    return text if truncated else text + "<|im_end|>"


def kimi_k2(reasoning: str, content: str, calls: Sequence[Call], truncated: bool) -> str:
    text = f"{content}{_kimi_section(calls)}"
    return text if truncated else text + "<|im_end|>"


def qwen3(reasoning: str, content: str, calls: Sequence[Call], truncated: bool) -> str:
    if truncated and not content and not calls:
        return f"<think>\n{reasoning}"
    text = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content
    for c in calls:
        name, args = _fn(c)
        text += f'\n<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    return text if truncated else text + "<|im_end|>"


def chatml(reasoning: str, content: str, calls: Sequence[Call], truncated: bool) -> str:
    return content if truncated else content + "<|im_end|>"


Layout = Callable[[str, str, Sequence[Call], bool], str]
FAMILIES: dict[str, Layout] = {
    "kimi-k2.5": kimi_k25,
    "kimi-k2": kimi_k2,
    "qwen3": qwen3,
    "chatml": chatml,
}
STRAY_MARKERS = ("<think>", "</think>", "<|im_end|>", "<|tool_calls_section_begin|>")
"""Markers that must never appear inside content: a parser that let one through."""


@cache
def load_tokenizer(spec: str) -> Tokenizer:
    """`sim` (the small tokenizer shipped with the simulator, for offline use), a
    tokenizer.json file, a folder holding one, or a Hugging Face hub id."""
    try:
        if spec == "sim":
            path = resources.files("regen.sim").joinpath("tokenizer", "tokenizer.json")
            return Tokenizer.from_str(path.read_text(encoding="utf-8"))
        p = Path(spec).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if p.is_file():
            return Tokenizer.from_file(str(p))
        if spec.startswith(("/", ".", "~")) or spec.endswith(".json"):
            raise ConfigError(f"tokenizer {spec!r}: no such file or folder")
        return Tokenizer.from_pretrained(spec)
    except ConfigError:
        raise
    except Exception as exc:  # the library raises many kinds; each becomes one line
        raise ConfigError(f"tokenizer {spec!r}: cannot load: {str(exc).splitlines()[0]}") from exc


def completion_ids(
    tok: Tokenizer,
    family: str,
    reasoning: str | None,
    content: str,
    calls: Sequence[Call],
    finish_reason: str | None,
) -> list[int]:
    """The answer's ids as the model produced them, by its family's grammar."""
    layout = FAMILIES.get(family)
    if layout is None:
        raise ConfigError(f"unknown template family {family!r} (allowed: {', '.join(FAMILIES)})")
    text = layout(reasoning or "", content, calls, finish_reason == "length")
    return list(tok.encode(text, add_special_tokens=False).ids)
