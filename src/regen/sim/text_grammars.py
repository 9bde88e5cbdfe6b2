"""The simulator's other model families, parsed as text the way a server's reasoning and
tool-call parsers read it: Kimi-K2, DeepSeek-V3 and R1, GLM-4.5, gpt-oss (harmony) and plain
ChatML. Like grammar.py, this is the simulator's own code, apart from regen's reconstruction.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer

from regen.sim.tokens import Call, Parsed, _encode, _special


class TextGrammar:
    """A server's parser of a family's completions: text, then one end-of-turn token."""

    name = ""
    ends: tuple[str, ...] = ()

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.end_ids = {_special(tok, t): t for t in self.ends}

    # to override
    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        raise NotImplementedError

    def parse(self, ids: list[int], thinking: bool) -> Parsed:
        complete = bool(ids) and ids[-1] in self.end_ids
        body = ids[:-1] if complete else ids
        reasoning, content, calls = self.split(
            self.tok.decode(body, skip_special_tokens=False), thinking
        )
        n_reasoning = len(_encode(self.tok, reasoning)) if reasoning else 0
        return Parsed(reasoning, content, calls, n_reasoning, complete)


def _leading_think(text: str, opener: str) -> tuple[str, str]:
    """(reasoning, the rest) of a completion that may open with a think block; a block cut
    before its `</think>` is all reasoning."""
    if not text.startswith(opener):
        return "", text
    reasoning, sep, rest = text[len(opener) :].partition("</think>")
    return reasoning, rest if sep else ""


# Kimi-K2 -----------------------------------------------------------------------------------

_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S
)


class KimiK2(TextGrammar):
    """No pre-filled think: the prompt ends at the assistant header; a thinking model writes
    `<think>...</think>` itself. No reasoning is kept in the history."""

    name = "kimi-k2"
    ends = ("<|im_end|>",)

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, text = _leading_think(text, "<think>")
        content, _, section = text.partition("<|tool_calls_section_begin|>")
        calls = [
            Call(cid.removeprefix("functions.").rsplit(":", 1)[0], args)
            for cid, args in _KIMI_CALL.findall(section)
        ]
        return reasoning, content, calls


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

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        content, _, section = text.partition("<｜tool▁calls▁begin｜>")
        return "", content, [Call(n, a) for n, a in _DS_CALL.findall(section)]


class DeepSeekR1(DeepSeekV3):
    """The prompt pre-fills `<think>\\n`; the model writes its reasoning, `</think>`, then the
    answer. The server splits at `</think>` and keeps both sides verbatim."""

    name = "deepseek-r1"
    think_prefill = "<think>\n"

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        reasoning, sep, rest = text.removeprefix("<think>").partition("</think>")
        if not sep:
            return reasoning, "", []
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


# gpt-oss (harmony) -------------------------------------------------------------------------


class GptOss(TextGrammar):
    """Harmony: the prompt ends at `<|start|>assistant`; the model writes an analysis message
    (its reasoning), then a final message ending `<|return|>` or a commentary tool call to
    `functions.NAME` ending `<|call|>`."""

    name = "gpt-oss"
    ends = ("<|return|>", "<|call|>")
    effort = "medium"

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


# ChatML ------------------------------------------------------------------------------------

_HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


class ChatML(TextGrammar):
    """`<|im_start|>{role}\\n{content}<|im_end|>\\n` turns; Hermes tool calls; no thinking."""

    name = "chatml"
    ends = ("<|im_end|>",)

    def split(self, text: str, thinking: bool) -> tuple[str, str, list[Call]]:
        content, _, _ = text.partition("<tool_call>")  # the provider strips the separator
        calls = []
        for body in _HERMES_CALL.findall(text):
            try:
                obj = json.loads(body)
                args = json.dumps(obj["arguments"], ensure_ascii=False)
                calls.append(Call(str(obj["name"]), args))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return "", content.strip("\n"), calls


TEXT_GRAMMARS: dict[str, type[TextGrammar]] = {
    g.name: g for g in (KimiK2, DeepSeekV3, DeepSeekR1, Glm45, GptOss, ChatML)
}
