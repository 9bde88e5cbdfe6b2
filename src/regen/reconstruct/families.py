"""The model families: their rules as data (families.toml, loaded here), and the hand-written
completion grammars of the few whose chat template cannot show what the model writes.

Every other family's completion is its template's own render of the answer (rendered.py). A
grammar knows what its generation prompt leaves open (Kimi-K2.5 pre-fills `<think>`,
DeepSeek-R1 `<think>\\n`, gpt-oss stops at `<|start|>assistant`), so the completion is exactly
what the model produced after the prompt: reasoning, its closing marker, content, the
tool-call section with the arguments verbatim, and the end-of-turn token. An answer cut at
max_tokens (`finish_reason == "length"`) has no end token, and only its reasoning when it was
cut there.

`thinking` is whether the prompt was rendered with thinking on: with it off, Kimi-K2.5's
pre-filled empty think block is left out of the completion.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
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

GRAMMARS: dict[str, Callable[[Answer], str]] = {
    "kimi_k25": kimi_k25,
    "kimi_k2": kimi_k2,
    "deepseek_v3": deepseek_v3,
    "deepseek_r1": deepseek_r1,
    "gpt_oss": gpt_oss,
}
"""The hand-written layouts a family may name (`grammar` in families.toml)."""


@dataclass(frozen=True)
class Family:
    """A model family: its rules as data (families.toml, where each field is described)."""

    name: str
    layout: Callable[[Answer], str] | None
    """The hand-written layout, or None: the chat template writes the answer."""
    thinking_kwarg: str | None = None
    markers: tuple[str, ...] = ()
    reasoning_key: str = "reasoning_content"
    prefills: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    append_stop: str = ""
    append_stop_after_calls: str = ""
    arguments: str = "object"
    syntax: str = "none"
    think: tuple[str, str] = ("<think>", "</think>")
    detect: tuple[str, ...] = ()
    verified: str = ""
    assumed: str = ""
    why_grammar: str = ""
    auto_without_thinking: str = ""
    reads: tuple[str, ...] = ()
    encoder: str = ""
    encoder_package: str = ""
    effort_kwarg: str = ""
    checked_templates: tuple[str, ...] = ()

    @property
    def from_template(self) -> bool:
        return self.layout is None

    def appended_stop(self, calls: bool) -> str:
        """The end token the model emits that the template does not write ("" if it does)."""
        return (self.append_stop_after_calls if calls else "") or self.append_stop


_FIELDS = {
    "grammar", "why_grammar", "thinking_kwarg", "markers", "reasoning_key", "prefills", "stop",
    "append_stop", "append_stop_after_calls", "arguments", "syntax", "think", "detect",
    "verified", "assumed", "auto_without_thinking", "reads", "encoder", "encoder_package",
    "effort_kwarg", "checked_templates",
}  # fmt: skip


def _family(name: str, data: dict[str, Any]) -> Family:
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValueError(f"families.toml [{name}]: unknown keys {sorted(unknown)}")
    if data.get("arguments", "object") not in ("object", "string"):
        raise ValueError(f"families.toml [{name}]: arguments must be object or string")
    grammar = data.pop("grammar", None)
    tuples = {k: tuple(v) for k, v in data.items() if isinstance(v, list)}
    return Family(
        name=name,
        layout=GRAMMARS[grammar] if grammar else None,
        **{**data, **tuples},
    )


def _load() -> dict[str, Family]:
    text = resources.files("regen.reconstruct").joinpath("families.toml").read_text("utf-8")
    return {name: _family(name, dict(d)) for name, d in tomllib.loads(text).items()}


FAMILIES: dict[str, Family] = _load()

AUTO = "auto"
"""`family = "auto"`: the family whose `detect` text the chat template holds."""


def family(name: str) -> Family:
    f = FAMILIES.get(name)
    if f is None:
        raise ConfigError(
            f"unknown template family {name!r} (allowed: auto, {', '.join(FAMILIES)}; "
            "`regen families` lists them)"
        )
    return f


def auto_without_template(name: str, tokenizer: str, chat_template: str | None) -> str | None:
    """Why `family = "auto"` cannot work with these settings (None when it can): it reads the
    model's chat template, and the simulator's tokenizer has none of its own."""
    if name == AUTO and tokenizer == "sim" and not chat_template:
        return (
            'family = "auto" reads the model\'s chat template: set tokenizer (a folder, a '
            "tokenizer.json or a hub id) or chat_template, or name the family"
        )
    return None


def detect(template: str, thinking: bool = True) -> Family:
    """The family a chat template is (the first whose `detect` text it all holds), or the
    generic `template` family. Two families that share a template (DeepSeek-V3's is R1's)
    are told apart by whether the job asked for reasoning (`auto_without_thinking`). A
    family with hand-written rules gets only the templates they were checked on
    (`checked_templates`): another revision (Kimi-K2-Thinking's, read as Kimi-K2's) may
    write what the rules do not, so it gets the template-driven family."""
    f = matched(template, thinking)
    if f is None or unchecked(f, template):
        return FAMILIES["template"]
    return f


def matched(template: str, thinking: bool = True) -> Family | None:
    """The first family whose `detect` texts the template all holds, if any."""
    for f in FAMILIES.values():
        if f.detect and all(d in template for d in f.detect):
            return (
                FAMILIES[f.auto_without_thinking] if f.auto_without_thinking and not thinking else f
            )
    return None


def unchecked(f: Family, template: str) -> bool:
    """Whether `f` has hand-written rules that were not checked on this template."""
    return bool(f.checked_templates) and template_digest(template) not in f.checked_templates


def template_digest(template: str) -> str:
    """A chat template's sha256, its Jinja comments (which render nothing) taken out and its
    line endings LF: a copy that differs only there is the same template."""
    text = re.sub(r"\{#.*?#\}", "", template.replace("\r\n", "\n"), flags=re.S)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
