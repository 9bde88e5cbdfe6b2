"""The simulator's other model families, written and parsed as text the way a server's
reasoning and tool-call parsers read it: Kimi-K2, DeepSeek-V3 and R1, GLM-4.5, gpt-oss
(harmony) and plain ChatML.

Each renders its prompt in the family's layout, writes a completion (reasoning, content,
tool calls, end-of-turn token) as ids of the sim tokenizer, and parses ids back. Like
grammar.py, this is the simulator's own code, apart from regen's reconstruction.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer

from regen.sim.grammar import Call, KimiK25, Parsed, _encode, _special, _text, render_kimi


class TextGrammar:
    """Completion = text in the family's layout + one end-of-turn token."""

    name = ""
    ends: tuple[str, ...] = ()

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.end_ids = {_special(tok, t): t for t in self.ends}

    # to override
    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        raise NotImplementedError

    def end(self, calls: list[Call]) -> str:
        return self.ends[0]

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        raise NotImplementedError

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        raise NotImplementedError

    # shared
    def completion_ids(
        self, reasoning: str, content: str, calls: list[Call], thinking: bool
    ) -> list[int]:
        text = self.text(reasoning, content, calls, thinking)
        return [*_encode(self.tok, text), _special(self.tok, self.end(calls))]

    def parse(self, ids: list[int], thinking: bool) -> Parsed:
        complete = bool(ids) and ids[-1] in self.end_ids
        body = ids[:-1] if complete else ids
        reasoning, content, calls = self.split(
            self.tok.decode(body, skip_special_tokens=False), thinking
        )
        n_reasoning = len(_encode(self.tok, reasoning)) if reasoning else 0
        return Parsed(reasoning, content, calls, n_reasoning, complete)


def _msgs(messages: list[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if isinstance(m, dict)]


def _calls_of(m: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, name, arguments text) of a history message's tool calls."""
    out = []
    for i, c in enumerate(m.get("tool_calls") or []):
        fn = c.get("function") or {}
        name = str(fn.get("name") or "")
        out.append((c.get("id") or f"functions.{name}:{i}", name, _text(fn.get("arguments"))))
    return out


def _leading_think(text: str, opener: str) -> tuple[str, str]:
    """(reasoning, the rest) of a completion that may open with a think block; a block cut
    before its `</think>` is all reasoning."""
    if not text.startswith(opener):
        return "", text
    reasoning, sep, rest = text[len(opener) :].partition("</think>")
    return reasoning, rest if sep else ""


def _tools_json(tools: list[Any]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


# Kimi-K2 -----------------------------------------------------------------------------------

_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S
)


class KimiK2(TextGrammar):
    """No pre-filled think: the prompt ends at the assistant header; a thinking model writes
    `<think>...</think>` itself. No reasoning is kept in the history."""

    name = "kimi-k2"
    ends = ("<|im_end|>",)

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        think = f"<think>{reasoning}</think>" if thinking else ""
        return think + content + KimiK25._section(calls)

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, text = _leading_think(text, "<think>")
        content, _, section = text.partition("<|tool_calls_section_begin|>")
        calls = [
            Call(cid.removeprefix("functions.").rsplit(":", 1)[0], args)
            for cid, args in _KIMI_CALL.findall(section)
        ]
        return reasoning, content, calls

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        return render_kimi(messages, tools, None)


# DeepSeek ----------------------------------------------------------------------------------

_DS_CALL = re.compile(
    r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```<｜tool▁call▁end｜>",
    re.S,
)


class DeepSeekV3(TextGrammar):
    """`<｜User｜>...<｜Assistant｜>{content}[<｜tool▁calls▁begin｜>...]<｜end▁of▁sentence｜>`."""

    name = "deepseek-v3"
    ends = ("<｜end▁of▁sentence｜>",)
    think_prefill = ""

    def _calls(self, calls: list[tuple[str, str]]) -> str:
        if not calls:
            return ""
        inner = "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```"
            "<｜tool▁call▁end｜>"
            for name, args in calls
        )
        return f"<｜tool▁calls▁begin｜>{inner}<｜tool▁calls▁end｜>"

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        return content + self._calls([(c.name, c.arguments) for c in calls])

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        content, _, section = text.partition("<｜tool▁calls▁begin｜>")
        return "", content, [Call(n, a) for n, a in _DS_CALL.findall(section)]

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        msgs = _msgs(messages)
        system = "\n\n".join(_text(m.get("content")) for m in msgs if m.get("role") == "system")
        if tools:
            system = (system + "\n\n" if system else "") + "## Tools\n" + _tools_json(tools)
        out = ["<｜begin▁of▁sentence｜>", system]
        for m in msgs:
            role, content = m.get("role"), _text(m.get("content"))
            if role == "user":
                out.append(f"<｜User｜>{content}")
            elif role == "assistant":
                calls = self._calls([(name, args) for _, name, args in _calls_of(m)])
                out.append(f"<｜Assistant｜>{content}{calls}<｜end▁of▁sentence｜>")
            elif role == "tool":
                out.append(
                    "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                    f"{content}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
                )
        out.append("<｜Assistant｜>" + self.think_prefill)
        return "".join(out)


class DeepSeekR1(DeepSeekV3):
    """The prompt pre-fills `<think>\\n`; the model writes its reasoning, `</think>`, then the
    answer. The server splits at `</think>` and keeps both sides verbatim."""

    name = "deepseek-r1"
    think_prefill = "<think>\n"

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        return f"{reasoning}\n</think>\n\n" + super().text(reasoning, content, calls, thinking)

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, sep, rest = text.partition("</think>")
        if not sep:
            return text, "", []
        _, content, calls = super().split(rest, thinking)
        return reasoning, content, calls


# GLM-4.5 -----------------------------------------------------------------------------------

_GLM_CALL = re.compile(r"<tool_call>(.*?)\n(.*?)</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\n<arg_value>(.*?)</arg_value>\n", re.S)


class Glm45(TextGrammar):
    """`[gMASK]<sop><|user|>\\n...<|assistant|>`, then `\\n<think>...</think>\\n{content}` and
    tool calls written key by key; the model stops on `<|observation|>` after tool calls and
    on `<|user|>` otherwise."""

    name = "glm-4.5"
    ends = ("<|user|>", "<|observation|>")

    def end(self, calls: list[Call]) -> str:
        return "<|observation|>" if calls else "<|user|>"

    @staticmethod
    def _call(name: str, args: str) -> str:
        try:
            obj = json.loads(args)
        except json.JSONDecodeError:
            obj = {}
        pairs = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>"
            f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</arg_value>\n"
            for k, v in (obj.items() if isinstance(obj, dict) else [])
        )
        return f"\n<tool_call>{name}\n{pairs}</tool_call>"

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        out = f"\n<think>{reasoning}</think>" if thinking else ""
        if content:
            out += "\n" + content
        return out + "".join(self._call(c.name, c.arguments) for c in calls)

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, text = _leading_think(text, "\n<think>")
        head, _, _ = text.partition("\n<tool_call>")
        calls = []
        for name, body in _GLM_CALL.findall(text):
            args: dict[str, Any] = {}
            for k, v in _GLM_ARG.findall(body):
                try:
                    args[k] = json.loads(v)
                except json.JSONDecodeError:
                    args[k] = v
            # The server's parser hands the arguments on as a JSON object it serialized.
            calls.append(Call(name, json.dumps(args, ensure_ascii=False)))
        return reasoning, head.removeprefix("\n"), calls

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        out = ["[gMASK]<sop>"]
        if tools:
            out.append(f"<|system|>\n# Tools\n\n{_tools_json(tools)}")
        msgs = _msgs(messages)
        last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
        for i, m in enumerate(msgs):
            role, content = m.get("role"), _text(m.get("content"))
            if role == "system":
                out.append(f"<|system|>\n{content}")
            elif role == "user":
                out.append(f"<|user|>\n{content}")
            elif role == "assistant":
                reasoning = _text(m.get("reasoning") or m.get("reasoning_content"))
                think = reasoning if i > last_user else ""
                turn = f"<|assistant|>\n<think>{think}</think>"
                if content:
                    turn += "\n" + content
                turn += "".join(self._call(name, args) for _, name, args in _calls_of(m))
                out.append(turn)
            elif role == "tool":
                out.append(f"<|observation|>\n<tool_response>\n{content}\n</tool_response>")
        out.append("<|assistant|>" + ("" if thinking else "\n<think></think>"))
        return "".join(out)


# gpt-oss (harmony) -------------------------------------------------------------------------

_HARMONY_SYSTEM = (
    "You are ChatGPT, a large language model trained by OpenAI.\nReasoning: {effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)


class GptOss(TextGrammar):
    """Harmony: the prompt ends at `<|start|>assistant`; the model writes an analysis message
    (its reasoning), then a final message ending `<|return|>` or a commentary tool call to
    `functions.NAME` ending `<|call|>`."""

    name = "gpt-oss"
    ends = ("<|return|>", "<|call|>")
    effort = "medium"

    def end(self, calls: list[Call]) -> str:
        return "<|call|>" if calls else "<|return|>"

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        out = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"
        if not calls:
            return out + f"<|channel|>final<|message|>{content}"
        if content:
            out += f"<|channel|>commentary<|message|>{content}<|end|><|start|>assistant"
        return out + "<|call|><|start|>assistant".join(
            f"<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>{c.arguments}"
            for c in calls
        )

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, content, calls = "", "", []
        for message in re.split(r"<\|start\|>assistant|<\|call\|>", text):
            header, sep, body = message.partition("<|message|>")
            if not sep:
                continue
            body = body.removesuffix("<|end|>")
            if header == "<|channel|>analysis":
                reasoning = body
            elif " to=functions." in header:
                name = header.split(" to=functions.", 1)[1].split(" ", 1)[0]
                calls.append(Call(name, body))
            else:  # final, or a commentary preamble
                content = body
        return reasoning, content, calls

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        msgs = _msgs(messages)
        system = _HARMONY_SYSTEM.format(effort=self.effort)
        if tools:
            system += "\nCalls to these tools must go to the commentary channel: 'functions'."
        out = [f"<|start|>system<|message|>{system}<|end|>"]
        instructions = "\n\n".join(
            _text(m.get("content")) for m in msgs if m.get("role") in ("system", "developer")
        )
        if instructions or tools:
            dev = f"# Instructions\n\n{instructions}" if instructions else ""
            if tools:
                dev += ("\n\n" if dev else "") + "# Tools\n\n" + _tools_json(tools)
            out.append(f"<|start|>developer<|message|>{dev}<|end|>")
        names: dict[str, str] = {}
        for m in msgs:
            role, content = m.get("role"), _text(m.get("content"))
            if role == "user":
                out.append(f"<|start|>user<|message|>{content}<|end|>")
            elif role == "assistant":
                calls = _calls_of(m)
                if calls:
                    if content:
                        out.append(
                            f"<|start|>assistant<|channel|>commentary<|message|>{content}<|end|>"
                        )
                    for cid, name, args in calls:
                        names[cid] = name
                        out.append(
                            f"<|start|>assistant<|channel|>commentary to=functions.{name} "
                            f"<|constrain|>json<|message|>{args}<|call|>"
                        )
                else:
                    out.append(f"<|start|>assistant<|channel|>final<|message|>{content}<|end|>")
            elif role == "tool":
                name = m.get("name") or names.get(str(m.get("tool_call_id")), "tool")
                out.append(
                    f"<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>"
                    f"{content}<|end|>"
                )
        out.append("<|start|>assistant")
        return "".join(out)


# ChatML ------------------------------------------------------------------------------------

_HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


class ChatML(TextGrammar):
    """`<|im_start|>{role}\\n{content}<|im_end|>\\n` turns; Hermes tool calls; no thinking."""

    name = "chatml"
    ends = ("<|im_end|>",)

    def text(self, reasoning: str, content: str, calls: list[Call], thinking: bool) -> str:
        return content + "".join(
            f'\n<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'
            for c in calls
        )

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        content, _, _ = text.partition("\n<tool_call>")
        calls = []
        for body in _HERMES_CALL.findall(text):
            try:
                obj = json.loads(body)
                calls.append(Call(str(obj["name"]), json.dumps(obj["arguments"])))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return "", content, calls

    def render_prompt(self, messages: list[Any], tools: list[Any], thinking: bool) -> str:
        msgs = _msgs(messages)
        out = []
        if tools:
            out.append(f"<|im_start|>system\n# Tools\n{_tools_json(tools)}<|im_end|>\n")
        for m in msgs:
            role, content = m.get("role"), _text(m.get("content"))
            calls = "".join(
                f'\n<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
                for _, name, args in _calls_of(m)
            )
            out.append(f"<|im_start|>{role}\n{content}{calls}<|im_end|>\n")
        out.append("<|im_start|>assistant\n")
        return "".join(out)


TEXT_GRAMMARS: dict[str, type[TextGrammar]] = {
    g.name: g for g in (KimiK2, DeepSeekV3, DeepSeekR1, Glm45, GptOss, ChatML)
}
