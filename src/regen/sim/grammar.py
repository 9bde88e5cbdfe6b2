"""How a server parses a completion's token ids back into reasoning, content and tool calls,
for each model family the simulator speaks (the text itself comes from the published chat
templates: chat.py).

This is the simulator's own implementation, kept apart from regen's reconstruction code, so
that an audit of one against the other tests something.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tokenizers import Tokenizer

from regen.sim.text_grammars import TEXT_GRAMMARS
from regen.sim.tokens import Call, Grammar, Parsed, sim_tokenizer, special_id

__all__ = ["FAMILIES", "Call", "Grammar", "Parsed", "grammar", "sim_tokenizer"]


class KimiK25:
    """`<think>` is pre-filled by the prompt; the completion is
    `{reasoning}</think>{content}[<|tool_calls_section_begin|>...<|tool_calls_section_end|>]<|im_end|>`.
    """

    name = "kimi-k2.5"

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

        def sid(t: str) -> int:
            return special_id(tok, t)

        self.think_end = sid("</think>")
        self.im_end = sid("<|im_end|>")
        self.section_begin = sid("<|tool_calls_section_begin|>")
        self.section_end = sid("<|tool_calls_section_end|>")
        self.call_begin = sid("<|tool_call_begin|>")
        self.arg_begin = sid("<|tool_call_argument_begin|>")
        self.call_end = sid("<|tool_call_end|>")

    def parse(self, ids: list[int], thinking: bool, tools: list[Any] | None = None) -> Parsed:
        dec = self.tok.decode
        complete = bool(ids) and ids[-1] == self.im_end
        body = ids[:-1] if complete else ids
        stops = (self.think_end, self.section_begin)
        r_end = next((i for i, t in enumerate(body) if t in stops), len(body)) if thinking else 0
        reasoning_ids = body[:r_end]
        rest = (
            body[r_end + 1 :]
            if r_end < len(body) and body[r_end] == self.think_end
            else (body[r_end:])
        )
        c_end = rest.index(self.section_begin) if self.section_begin in rest else len(rest)
        content = dec(rest[:c_end], skip_special_tokens=False)
        calls = []
        section = rest[c_end + 1 :]
        while self.call_begin in section and self.call_end in section:
            b, e = section.index(self.call_begin), section.index(self.call_end)
            inner = section[b + 1 : e]
            if self.arg_begin in inner:
                a = inner.index(self.arg_begin)
                cid = dec(inner[:a], skip_special_tokens=False)
                name = cid.removeprefix("functions.").rsplit(":", 1)[0]
                calls.append(Call(name, dec(inner[a + 1 :], skip_special_tokens=False)))
            section = section[e + 1 :]
        return Parsed(
            dec(reasoning_ids, skip_special_tokens=False),
            content,
            calls,
            len(reasoning_ids),
            complete,
        )


class Qwen3:
    """Thinking mode: the model writes `<think>\\n{reasoning}\\n</think>\\n\\n{content}`, tool calls
    as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, then `<|im_end|>`.
    With thinking off the prompt pre-fills an empty think block.
    """

    name = "qwen3"

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.think_begin = special_id(tok, "<think>")
        self.think_end = special_id(tok, "</think>")
        self.im_end = special_id(tok, "<|im_end|>")
        self.call_begin = special_id(tok, "<tool_call>")
        self.call_end = special_id(tok, "</tool_call>")

    def parse(self, ids: list[int], thinking: bool, tools: list[Any] | None = None) -> Parsed:
        dec = self.tok.decode
        complete = bool(ids) and ids[-1] == self.im_end
        body = ids[:-1] if complete else ids
        reasoning, reasoning_tokens, rest = "", 0, body
        if thinking and body and body[0] == self.think_begin:
            end = body.index(self.think_end) if self.think_end in body else len(body)
            r_ids = body[1:end]
            reasoning_tokens = len(r_ids)
            reasoning = dec(r_ids, skip_special_tokens=False).strip("\n")
            rest = body[end + 1 :]
        c_end = rest.index(self.call_begin) if self.call_begin in rest else len(rest)
        content = dec(rest[:c_end], skip_special_tokens=False).lstrip("\n").rstrip("\n")
        calls = []
        section = rest[c_end:]
        while self.call_begin in section and self.call_end in section:
            b, e = section.index(self.call_begin), section.index(self.call_end)
            try:
                obj = json.loads(dec(section[b + 1 : e], skip_special_tokens=False))
                # vLLM's hermes parser re-serializes the arguments object.
                args = json.dumps(obj["arguments"], ensure_ascii=False)
                calls.append(Call(str(obj["name"]), args))
            except (json.JSONDecodeError, KeyError, TypeError):
                pass
            section = section[e + 1 :]
        return Parsed(reasoning, content, calls, reasoning_tokens, complete)


FAMILIES = (
    "kimi-k2.5", "kimi-k2", "qwen3", "deepseek-v3", "deepseek-r1", "glm-4.5", "gpt-oss", "chatml",
    "glm-4.7", "minimax-m2", "qwen3-coder", "qwen3.5", "kimi-k3", "llama4",
)  # fmt: skip


@cache
def grammar(family: str) -> Grammar:
    tok = sim_tokenizer()
    if family == "kimi-k2.5":
        return KimiK25(tok)
    if family == "qwen3":
        return Qwen3(tok)
    if family in TEXT_GRAMMARS:
        return TEXT_GRAMMARS[family](tok)
    raise ValueError(f"unknown family {family!r} (allowed: {', '.join(FAMILIES)})")
