"""Model-family grammars on the simulator's side: how a prompt is rendered (to count its
tokens), how a completion is laid out as token ids, and how a server parses those ids back
into reasoning, content and tool calls.

This is the simulator's own implementation, kept apart from regen's reconstruction code, so
that an audit of one against the other tests something.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol

from tokenizers import Tokenizer

from regen.sim.words import WORDS

KIMI_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."


@cache
def sim_tokenizer() -> Tokenizer:
    """The small tokenizer shipped with the simulator (built by scripts/build_sim_tokenizer.py)."""
    path = resources.files("regen.sim").joinpath("tokenizer", "tokenizer.json")
    return Tokenizer.from_str(path.read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call as the model wrote it: name and the argument text, verbatim."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the server makes of completion ids."""

    reasoning: str
    content: str
    calls: list[Call]
    reasoning_tokens: int
    complete: bool
    """False when the ids stop before the end-of-turn token (cut at max_tokens)."""


class Grammar(Protocol):
    name: str

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str: ...

    def completion_ids(
        self, reasoning: str, content: str, calls: list[Call], thinking: bool
    ) -> list[int]: ...

    def parse(self, ids: list[int], thinking: bool) -> Parsed: ...


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else json.dumps(v, ensure_ascii=False))


def _special(tok: Tokenizer, token: str) -> int:
    tid = tok.token_to_id(token)
    if tid is None:
        raise ValueError(f"the sim tokenizer has no {token} token")
    return int(tid)


@cache
def _word_ids() -> tuple[dict[str, int], dict[str, int]]:
    """Ids of each sim word at the start of a text and after a space (one token each)."""
    tok = sim_tokenizer()
    first = {w: tok.encode(w, add_special_tokens=False).ids for w in WORDS}
    spaced = {w: tok.encode(" " + w, add_special_tokens=False).ids for w in WORDS}
    return (
        {w: i[0] for w, i in first.items() if len(i) == 1},
        {w: i[0] for w, i in spaced.items() if len(i) == 1},
    )


def _encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of text. Text made of sim words joined by single spaces maps word by word
    (the same ids the tokenizer gives, far cheaper); anything else goes to the tokenizer."""
    if not text:
        return []
    first, spaced = _word_ids()
    words = text.split(" ")
    head = first.get(words[0])
    if head is not None:
        try:
            return [head, *(spaced[w] for w in words[1:])]
        except KeyError:
            pass
    return list(tok.encode(text, add_special_tokens=False).ids)


def render_kimi(messages: list[Any], tools: list[Any], think: bool | None) -> str:
    """A Kimi prompt: no newlines between turns, tool declarations as JSON. With `think` set
    (K2.5), assistant turns carry `<think>...</think>`, with reasoning kept only after the last
    assistant turn without tool calls, and the prompt pre-fills `<think>` (thinking on) or
    `<think></think>` (off). With `think` None (K2), neither."""
    out = []
    if tools:
        decls = json.dumps(tools, ensure_ascii=False)  # as a template's tojson writes them
        out.append(f"<|im_system|>tool_declare<|im_middle|>{decls}<|im_end|>")
    msgs = [m for m in messages if isinstance(m, dict)]
    if not msgs or msgs[0].get("role") != "system":
        out.append(f"<|im_system|>system<|im_middle|>{KIMI_DEFAULT_SYSTEM}<|im_end|>")
    last_plain = max(
        (i for i, m in enumerate(msgs) if m.get("role") == "assistant" and not m.get("tool_calls")),
        default=-1,
    )
    for i, m in enumerate(msgs):
        role, content = m.get("role"), _text(m.get("content"))
        if role == "system":
            out.append(f"<|im_system|>system<|im_middle|>{content}<|im_end|>")
        elif role == "user":
            out.append(f"<|im_user|>user<|im_middle|>{content}<|im_end|>")
        elif role == "assistant":
            block = ""
            if think is not None:
                reasoning = _text(m.get("reasoning") or m.get("reasoning_content"))
                block = f"<think>{reasoning if i > last_plain else ''}</think>"
            section = KimiK25._section(m.get("tool_calls") or [])
            out.append(f"<|im_assistant|>assistant<|im_middle|>{block}{content}{section}<|im_end|>")
        elif role == "tool":
            name = m.get("name") or "tool"
            out.append(
                f"<|im_system|>{name}<|im_middle|>## Return of {m.get('tool_call_id')}\n"
                f"{content}<|im_end|>"
            )
    out.append("<|im_assistant|>assistant<|im_middle|>")
    if think is not None:
        out.append("<think>" if think else "<think></think>")
    return "".join(out)


class KimiK25:
    """`<think>` is pre-filled by the prompt; the completion is
    `{reasoning}</think>{content}[<|tool_calls_section_begin|>...<|tool_calls_section_end|>]<|im_end|>`.
    """

    name = "kimi-k2.5"

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

        def sid(t: str) -> int:
            return _special(tok, t)

        self.think_end = sid("</think>")
        self.im_end = sid("<|im_end|>")
        self.section_begin = sid("<|tool_calls_section_begin|>")
        self.section_end = sid("<|tool_calls_section_end|>")
        self.call_begin = sid("<|tool_call_begin|>")
        self.arg_begin = sid("<|tool_call_argument_begin|>")
        self.call_end = sid("<|tool_call_end|>")

    @staticmethod
    def _section(calls: Sequence[dict[str, Any] | Call]) -> str:
        if not calls:
            return ""
        parts = []
        for i, c in enumerate(calls):
            if isinstance(c, Call):
                cid, args = f"functions.{c.name}:{i}", c.arguments
            else:
                fn = c.get("function") or {}
                cid = c.get("id") or f"functions.{fn.get('name')}:{i}"
                args = _text(fn.get("arguments"))
            parts.append(
                f"<|tool_call_begin|>{cid}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
            )
        return "<|tool_calls_section_begin|>" + "".join(parts) + "<|tool_calls_section_end|>"

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        return render_kimi(messages, tools, thinking)

    def completion_ids(
        self, reasoning: str, content: str, calls: list[Call], thinking: bool
    ) -> list[int]:
        ids = _encode(self.tok, reasoning) + [self.think_end] if thinking else []
        ids += _encode(self.tok, content)
        if calls:
            ids += _encode(self.tok, self._section(calls))
        return ids + [self.im_end]

    def parse(self, ids: list[int], thinking: bool) -> Parsed:
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
        self.think_begin = _special(tok, "<think>")
        self.think_end = _special(tok, "</think>")
        self.im_end = _special(tok, "<|im_end|>")
        self.call_begin = _special(tok, "<tool_call>")
        self.call_end = _special(tok, "</tool_call>")

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        out = []
        msgs = [m for m in messages if isinstance(m, dict)]
        system = _text(msgs[0].get("content")) if msgs and msgs[0].get("role") == "system" else ""
        if tools:
            decls = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            system = (system + "\n\n" if system else "") + f"# Tools\n<tools>\n{decls}\n</tools>"
        if system:
            out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        for m in msgs:
            role, content = m.get("role"), _text(m.get("content"))
            if role in ("user", "assistant"):
                calls = "".join(
                    f'\n<tool_call>\n{{"name": "{fn.get("name")}", "arguments": '
                    f"{_text(fn.get('arguments'))}}}\n</tool_call>"
                    for fn in ((c.get("function") or {}) for c in m.get("tool_calls") or [])
                )
                out.append(f"<|im_start|>{role}\n{content}{calls}<|im_end|>\n")
            elif role == "tool":
                out.append(
                    f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
                )
        out.append("<|im_start|>assistant\n")
        if not thinking:
            out.append("<think>\n\n</think>\n\n")
        return "".join(out)

    @staticmethod
    def _call_text(c: Call) -> str:
        return f'\n<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'

    def completion_ids(
        self, reasoning: str, content: str, calls: list[Call], thinking: bool
    ) -> list[int]:
        text = f"<think>\n{reasoning}\n</think>\n\n" if thinking else ""
        text += content + "".join(self._call_text(c) for c in calls)
        return _encode(self.tok, text) + [self.im_end]

    def parse(self, ids: list[int], thinking: bool) -> Parsed:
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
                calls.append(Call(str(obj["name"]), json.dumps(obj["arguments"])))
            except (json.JSONDecodeError, KeyError, TypeError):
                pass
            section = section[e + 1 :]
        return Parsed(reasoning, content, calls, reasoning_tokens, complete)


FAMILIES = (
    "kimi-k2.5", "kimi-k2", "qwen3", "deepseek-v3", "deepseek-r1", "glm-4.5", "gpt-oss", "chatml"
)  # fmt: skip


@cache
def grammar(family: str) -> Grammar:
    from regen.sim.text_grammars import TEXT_GRAMMARS

    tok = sim_tokenizer()
    if family == "kimi-k2.5":
        return KimiK25(tok)
    if family == "qwen3":
        return Qwen3(tok)
    if family in TEXT_GRAMMARS:
        return TEXT_GRAMMARS[family](tok)
    raise ValueError(f"unknown family {family!r} (allowed: {', '.join(FAMILIES)})")
