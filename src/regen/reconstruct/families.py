"""Completion grammars: how each model family writes an answer as text, token for token.

A family knows what its generation prompt leaves open (Kimi-K2.5 pre-fills `<think>`,
DeepSeek-R1 `<think>\\n`, gpt-oss stops at `<|start|>assistant`), so the completion is exactly
what the model produced after the prompt: reasoning, its closing marker, content, the tool-call
section with the arguments verbatim, and the end-of-turn token. An answer cut at max_tokens
(`finish_reason == "length"`) has no end token, and only its reasoning when it was cut there.

`thinking` is whether the prompt was rendered with thinking on: with it off, the families that
pre-fill an empty think block (Kimi-K2.5, Qwen3, GLM-4.5) leave it out of the completion.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from regen.errors import ConfigError

Call = dict[str, Any]
"""A tool call in OpenAI form: {"id", "type", "function": {"name", "arguments"}}."""


def call_parts(call: Call) -> tuple[str, str]:
    """(name, arguments text): arguments as the model wrote them when they came as text."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return str(fn.get("name") or ""), text


@dataclass(frozen=True)
class Answer:
    reasoning: str
    content: str
    calls: Sequence[Call]
    truncated: bool
    thinking: bool
    calls_before: int = 0
    """Tool calls in the history before this answer (Kimi numbers its call ids across the
    whole conversation)."""
    prefill: str = ""
    """What the rendered prompt already ends with of the answer (one of the family's
    `prefills`, e.g. Kimi-K2.5's `<think>`): the completion starts after it."""

    @property
    def cut_in_reasoning(self) -> bool:
        return self.truncated and not self.content and not self.calls


def _end(a: Answer, text: str, end: str) -> str:
    return text if a.truncated else text + end


def _after(a: Answer, text: str) -> str:
    """The text the model wrote after what the prompt pre-filled."""
    return text.removeprefix(a.prefill) if a.prefill else text


# Kimi --------------------------------------------------------------------------------------


_KIMI_ID = re.compile(r"functions\.(.+):(\d+)")


def kimi_call_id(call: Call, name: str, index: int) -> str:
    """The id a Kimi model writes: `functions.NAME:IDX`, IDX counted over the conversation.
    A server that hands the model's id back (vLLM, SGLang) gives it as it is; a provider id
    of another shape (`call_8f2a...`) is not what the model wrote."""
    cid = str(call.get("id") or "")
    m = _KIMI_ID.fullmatch(cid)
    if m and m.group(1) == name:
        return cid
    return f"functions.{name}:{index}"


def _kimi_section(calls: Sequence[Call], base: int) -> str:
    if not calls:
        return ""
    parts = []
    for i, c in enumerate(calls):
        name, args = call_parts(c)
        cid = kimi_call_id(c, name, base + i)
        parts.append(f"<|tool_call_begin|>{cid}<|tool_call_argument_begin|>{args}<|tool_call_end|>")
    return "<|tool_calls_section_begin|>" + "".join(parts) + "<|tool_calls_section_end|>"


def kimi_k25(a: Answer) -> str:
    """`{reasoning}</think>{content}[section]<|im_end|>` after the `<think>` the template
    pre-fills (`<think></think>` with thinking off)."""
    if a.thinking and a.cut_in_reasoning:
        return _after(a, "<think>" + a.reasoning)
    think = f"<think>{a.reasoning}</think>" if a.thinking else "<think></think>"
    text = think + a.content + _kimi_section(a.calls, a.calls_before)
    return _after(a, _end(a, text, "<|im_end|>"))


def kimi_k2(a: Answer) -> str:
    """The prompt ends at the assistant header; K2-Thinking writes `<think>` itself."""
    think = ""
    if a.reasoning:
        if a.cut_in_reasoning:
            return f"<think>{a.reasoning}"
        think = f"<think>{a.reasoning}</think>"
    return _end(a, think + a.content + _kimi_section(a.calls, a.calls_before), "<|im_end|>")


# ChatML, Qwen3 -----------------------------------------------------------------------------


def _hermes_calls(body: str, calls: Sequence[Call]) -> str:
    """Hermes tool calls after `body` (the text before them). As Qwen's templates write them:
    a newline before a call only after text or another call, so a call-only answer starts
    with `<tool_call>`. A body that ends in a newline already has it (vLLM's parser returns
    the text before `<tool_call>` as it is, separator included)."""
    out = ""
    for i, c in enumerate(calls):
        name, args = call_parts(c)
        sep = "\n" if i or (body and not body.endswith("\n")) else ""
        out += f'{sep}<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    return out


def qwen3(a: Answer) -> str:
    """Thinking on: `<think>\\n{reasoning}\\n</think>\\n\\n{content}`, as the template writes
    it; fields a server returned verbatim (vLLM: reasoning `\\nR\\n`, content `\\n\\nC`) keep
    their own newlines, stripped ones get the template's. Thinking off, the prompt pre-filled
    `<think>\\n\\n</think>\\n\\n`. Calls in Hermes form."""
    if not a.thinking or a.prefill == "<think>\n\n</think>\n\n":
        return _end(a, a.content + _hermes_calls(a.content, a.calls), "<|im_end|>")
    r = a.reasoning
    head = "" if r.startswith("\n") else "\n"
    if a.cut_in_reasoning:
        return _after(a, f"<think>{head}{r}")
    tail = "" if r.endswith("\n") else "\n"
    body = a.content if a.content.startswith("\n") else "\n\n" + a.content
    text = f"<think>{head}{r}{tail}</think>{body}{_hermes_calls(body, a.calls)}"
    return _after(a, _end(a, text, "<|im_end|>"))


def chatml(a: Answer) -> str:
    return _end(a, a.content + _hermes_calls(a.content, a.calls), "<|im_end|>")


# DeepSeek ----------------------------------------------------------------------------------

DS_EOS = "<｜end▁of▁sentence｜>"


def _deepseek_calls(calls: Sequence[Call]) -> str:
    if not calls:
        return ""
    parts = []
    for c in calls:
        name, args = call_parts(c)
        parts.append(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```"
            "<｜tool▁call▁end｜>"
        )
    return "<｜tool▁calls▁begin｜>" + "\n".join(parts) + "<｜tool▁calls▁end｜>"


def deepseek_v3(a: Answer) -> str:
    """The prompt ends at `<｜Assistant｜>`: `{content}[calls]<｜end▁of▁sentence｜>`."""
    return _end(a, a.content + _deepseek_calls(a.calls), DS_EOS)


def deepseek_r1(a: Answer) -> str:
    """`<think>\\n{reasoning}\\n</think>\\n\\n{content}`, its opening pre-filled by the current
    template (`<｜Assistant｜><think>\\n`) and written by the model under the first one. vLLM's
    parser keeps both sides verbatim (reasoning `R\\n`, content `\\n\\nC`); stripped fields get
    those newlines back."""
    # Verbatim reasoning after a `<think>` the model wrote itself keeps its own newline.
    opener = "<think>" if a.reasoning.startswith("\n") and not a.prefill else "<think>\n"
    if a.cut_in_reasoning:
        return _after(a, opener + a.reasoning)
    r = a.reasoning if a.reasoning.endswith("\n") else a.reasoning + "\n"
    body = a.content if a.content.startswith("\n") else "\n\n" + a.content
    text = f"{opener}{r}</think>{body}{_deepseek_calls(a.calls)}"
    return _after(a, _end(a, text, DS_EOS))


def _deepseek31_calls(calls: Sequence[Call]) -> str:
    """DeepSeek-V3.1's calls: `NAME<｜tool▁sep｜>ARGS`, chained with no separator."""
    if not calls:
        return ""
    parts = "".join(
        f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
        for name, args in map(call_parts, calls)
    )
    return f"<｜tool▁calls▁begin｜>{parts}<｜tool▁calls▁end｜>"


def deepseek_v31(a: Answer) -> str:
    """DeepSeek-V3.1: after a user turn the prompt ends `<｜Assistant｜><think>` (thinking on,
    `thinking` in the template) or `<｜Assistant｜></think>`, and the model writes
    `{reasoning}</think>{content}` or `{content}`; after tool results nothing is pre-filled and
    the model writes its content. Fields verbatim as the server split them."""
    tail = a.content + _deepseek31_calls(a.calls)
    if a.prefill != "<think>":
        return _end(a, tail, DS_EOS)
    if a.cut_in_reasoning:
        return a.reasoning
    return _end(a, f"{a.reasoning}</think>{tail}", DS_EOS)


# GLM-4.5 -----------------------------------------------------------------------------------


def _glm_calls(calls: Sequence[Call]) -> str:
    out = ""
    for c in calls:
        name, args = call_parts(c)
        try:
            obj = json.loads(args)
        except json.JSONDecodeError:
            obj = None
        out += f"\n<tool_call>{name}\n"
        if isinstance(obj, dict):
            for k, v in obj.items():
                value = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                out += f"<arg_key>{k}</arg_key>\n<arg_value>{value}</arg_value>\n"
        out += "</tool_call>"
    return out


def glm45(a: Answer) -> str:
    """The prompt ends at `<|assistant|>` (plus `\\n<think></think>` with thinking off). The
    model stops on `<|observation|>` after tool calls and on `<|user|>` otherwise; arguments
    are written key by key, so they are rebuilt from the parsed object."""
    text = ""
    if a.thinking:
        if a.cut_in_reasoning:
            return f"\n<think>{a.reasoning}"
        text = f"\n<think>{a.reasoning.strip()}</think>"
    if a.content.strip():  # the template strips both, and vLLM's parser hands back `\nC\n`
        text += "\n" + a.content.strip()
    text += _glm_calls(a.calls)
    return _end(a, text, "<|observation|>" if a.calls else "<|user|>")


# gpt-oss (harmony) -------------------------------------------------------------------------


def gpt_oss(a: Answer) -> str:
    """The prompt ends at `<|start|>assistant`: an analysis message with the reasoning, then
    the final message (`<|return|>`) or a commentary tool call (`<|call|>`)."""
    text = f"<|channel|>analysis<|message|>{a.reasoning}"
    if a.cut_in_reasoning:
        return text
    # An answer with no reasoning has no analysis message (the template writes none).
    text = text + "<|end|><|start|>assistant" if a.reasoning else ""
    if a.calls:
        if a.content:
            text += f"<|channel|>commentary<|message|>{a.content}<|end|><|start|>assistant"
        calls = []
        for c in a.calls:
            name, args = call_parts(c)
            calls.append(
                f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
            )
        body = "<|call|><|start|>assistant".join(calls)
        return _end(a, text + body, "<|call|>")
    return _end(a, f"{text}<|channel|>final<|message|>{a.content}", "<|return|>")


# The families -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    name: str
    layout: Callable[[Answer], str]
    thinking_kwarg: str | None
    """The chat template's switch for thinking, set from the job's reasoning setting."""
    markers: tuple[str, ...]
    """Control text that must never appear in parsed content or reasoning."""
    reasoning_key: str = "reasoning_content"
    """Where the chat template reads a history turn's reasoning."""
    prefills: tuple[str, ...] = ()
    """What the family's generation prompts may pre-fill of an answer, longest first."""


_KIMI = (
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
)
_QWEN = ("<think>", "</think>", "<|im_end|>", "<tool_call>", "</tool_call>")
_DS = ("<think>", "</think>", DS_EOS, "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
_GLM = ("<think>", "</think>", "<tool_call>", "<arg_key>", "<|observation|>", "<|user|>")
_HARMONY = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("kimi-k2.5", kimi_k25, "thinking", _KIMI, prefills=("<think></think>", "<think>")),
        Family("kimi-k2", kimi_k2, None, _KIMI),
        Family(
            "qwen3",
            qwen3,
            "enable_thinking",
            _QWEN,
            prefills=("<think>\n\n</think>\n\n", "<think>\n"),
        ),
        Family("deepseek-v3", deepseek_v3, None, _DS),
        Family("deepseek-r1", deepseek_r1, None, _DS, prefills=("<think>\n",)),
        Family("deepseek-v3.1", deepseek_v31, "thinking", _DS, prefills=("<think>", "</think>")),
        Family("glm-4.5", glm45, "enable_thinking", _GLM),
        Family("gpt-oss", gpt_oss, None, _HARMONY, reasoning_key="thinking"),
        Family("chatml", chatml, None, ("<|im_start|>", "<|im_end|>")),
    )
}


def family(name: str) -> Family:
    f = FAMILIES.get(name)
    if f is None:
        raise ConfigError(f"unknown template family {name!r} (allowed: {', '.join(FAMILIES)})")
    return f
