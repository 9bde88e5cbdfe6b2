"""The simulator's prompts and completions as text, from each family's published chat template
(tokenizer/templates/, SOURCES.md), rendered the way an OpenAI-compatible server renders them:
a Jinja sandbox like transformers', and a request's history prepared as vLLM prepares it (each
history tool call's arguments parsed, reasoning under the name templates read).

A completion is what the template writes for the answer after the generation prompt, where the
template shows it. Where it does not, the rule used is the model's published output form:
- DeepSeek-R1's template drops every answer's reasoning: `<think>\\n{reasoning}\\n</think>\\n\\n`
  before the content it writes;
- Kimi-K2.5's drops it for an answer without calls: `{reasoning}</think>` after its `<think>`;
- GLM-4.5's and GLM-4.7's write no stop token: `<|observation|>` after calls, `<|user|>`
  otherwise (their generation config's stop tokens);
- MiniMax-M2's writes `[e~[\\n` after a turn: the model stops on `[e~[`. Its template has no
  thinking switch: the model always reasons (generate.py draws reasoning whatever the request
  asks);
- GLM-4.7's and MiniMax-M2's write no think block for an answer without reasoning, where the
  prompt has opened one: the model closes it at once (`</think>`, `\\n</think>\\n\\n`);
- DeepSeek-V3/R1's cannot write a second call turn in a conversation: the answer is written
  as after a lone user turn;
- Llama 4's (vLLM's pythonic one) writes a call turn as `{content}[f(k="v"), g()]<|eot|>`,
  every value as quoted text; the model writes no content before its calls (CALLS_ALONE)
  and no reasoning (the family has none);
- gpt-oss samples a call's recipient after the channel (`<|channel|>commentary to=functions.X
  <|constrain|>json<|message|>`, harmony's format docs), where the template writes it after the
  role.

None of this comes from regen's reconstruction code, so an audit of one against the other
checks something.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from regen.reconstruct.kimi_ts import sorted_keys, tools_typescript

END = {
    "kimi-k2.5": "<|im_end|>",
    "kimi-k2": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "chatml": "<|im_end|>",
    "deepseek-v3": "<｜end▁of▁sentence｜>",
    "deepseek-r1": "<｜end▁of▁sentence｜>",
    "gpt-oss": "<|return|>",
    "minimax-m2": "[e~[",
    "qwen3-coder": "<|im_end|>",
    "qwen3.5": "<|im_end|>",
    "kimi-k3": "<|end_of_msg|>",
    "llama4": "<|eot|>",
}
SWITCH = {
    "qwen3": "enable_thinking",
    "glm-4.5": "enable_thinking",
    "glm-4.7": "enable_thinking",
    "qwen3.5": "enable_thinking",
    "kimi-k2.5": "thinking",
    "kimi-k3": "thinking",
}
"""The chat-template kwarg that turns a family's thinking on and off."""
GLM = ("glm-4.5", "glm-4.7")
"""Families whose template writes no stop token (the rule above)."""
ALWAYS_THINKS = frozenset({"minimax-m2"})
"""Families whose model reasons whatever the request asks (no switch in the template)."""
DROPS_EMPTY_THINK = frozenset({"glm-4.7", "minimax-m2"})
"""Families whose template writes no think block for an answer without reasoning (the rule
above)."""
_NO_REASONING = "\x00"
WRITES_CALL_IDS = frozenset({"kimi-k2.5", "kimi-k2"})
"""Families whose model writes its calls' ids (`functions.NAME:IDX`); a server makes the
others' ids."""
TEXT_ARGUMENTS = frozenset({"llama4"})
"""Families whose template writes every argument value as text (vLLM's pythonic Llama 4 one:
`k="%s"`, which a server reads back as a string): their model fills a call's text arguments
only, and a required one of another type as the text the template writes for it."""
CALLS_ALONE = frozenset({"llama4"})
"""Families whose model writes a call turn without text: the tool prompt of vLLM's pythonic
Llama 4 template says "NEVER combine text and function calls", and its llama4_pythonic parser
reads calls only from an answer's first character (text before them makes the whole answer
content)."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@cache
def special_tokens(family: str) -> dict[str, str]:
    """The family's special tokens, as its tokenizer_config.json names them (the sim's one
    tokenizer stands in for every family's: tokenizer/special_tokens.json)."""
    path = resources.files("regen.sim").joinpath("tokenizer", "special_tokens.json")
    table: dict[str, dict[str, str]] = json.loads(path.read_text(encoding="utf-8"))
    return table.get(family, {})


@cache
def template(family: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
    path = resources.files("regen.sim").joinpath("tokenizer", "templates", f"{family}.jinja")
    return env.from_string(path.read_text(encoding="utf-8"))


def server_messages(messages: list[Any], parse: bool) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        m = copy.deepcopy(m)
        if m.get("content") is None:
            m["content"] = ""
        if not m.get("tool_calls"):
            m.pop("tool_calls", None)  # vLLM drops an empty list; templates test the key
        reasoning = m.pop("reasoning", None) or m.get("reasoning_content")
        if reasoning:
            m["reasoning_content"] = m["thinking"] = reasoning
        m["tool_calls"] = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        if not m["tool_calls"]:
            m.pop("tool_calls")
        for call in m.get("tool_calls") or []:
            if not isinstance(call.get("function"), dict):
                call["function"] = {}
            fn = call["function"]
            args = fn.get("arguments")
            if parse and not isinstance(args, dict | list):
                try:
                    fn["arguments"] = json.loads(args) if isinstance(args, str) and args else {}
                except json.JSONDecodeError:
                    fn["arguments"] = {}
        out.append(m)
    return out


def _kwargs(family: str, tools: list[Any], thinking: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(special_tokens(family))
    if family in SWITCH:
        kw[SWITCH[family]] = thinking
    if family == "kimi-k2.5" and tools:
        ts = tools_typescript(tools)
        if ts:
            kw["tools_ts_str"] = ts
    return kw


def render(
    family: str, messages: list[Any], tools: list[Any], thinking: bool, generation: bool
) -> str:
    if family in ("kimi-k2", "kimi-k2.5") and tools:
        tools = sorted_keys(tools)  # K2's tokenizer sorts every key first (K3's template does)
    kw = _kwargs(family, tools, thinking)
    t = template(family)
    try:
        msgs = server_messages(messages, parse=True)
        return t.render(messages=msgs, tools=tools or None, add_generation_prompt=generation, **kw)
    except TypeError:  # DeepSeek's templates join the arguments as text
        msgs = server_messages(messages, parse=False)
        return t.render(messages=msgs, tools=tools or None, add_generation_prompt=generation, **kw)


def render_prompt(family: str, messages: list[Any], tools: list[Any], thinking: bool) -> str:
    """The prompt's text. A request is billed and then answered from the same prompt: the
    last few renderings are kept (by the request's content) so it is rendered once."""
    key = json.dumps([family, messages, tools, thinking], sort_keys=True, default=str)
    return _prompt_cached(key, family, messages, tools, thinking)


_PROMPTS: dict[str, str] = {}


def _prompt_cached(
    key: str, family: str, messages: list[Any], tools: list[Any], thinking: bool
) -> str:
    text = _PROMPTS.get(key)
    if text is None:
        text = render(family, messages, tools, thinking, generation=True)
        if len(_PROMPTS) >= 512:
            _PROMPTS.pop(next(iter(_PROMPTS)))  # the oldest
        _PROMPTS[key] = text
    return text


def completion_text(
    family: str,
    messages: list[Any],
    tools: list[Any],
    thinking: bool,
    answer: dict[str, Any],
) -> str:
    """What the model writes after the generation prompt for `answer` (an assistant message
    with `reasoning`, `content`, `tool_calls`), end-of-turn token included."""
    reasoning = answer.get("reasoning") or ""
    calls = answer.get("tool_calls") or []
    if family == "gpt-oss" and calls:
        return _harmony_call(reasoning, answer.get("content") or "", calls[0]["function"])
    if family in DROPS_EMPTY_THINK and not reasoning and (thinking or family in ALWAYS_THINKS):
        # The block the prompt opened, closed at once: written with a stand-in reasoning.
        stand_in = {**answer, "reasoning": _NO_REASONING}
        return completion_text(family, messages, tools, thinking, stand_in).replace(
            _NO_REASONING, "", 1
        )
    prompt = render_prompt(family, messages, tools, thinking)
    full = render(family, [*messages, answer], tools, thinking, generation=False)
    if family == "gpt-oss":  # the answer's own turn, after its `<|start|>assistant`
        opener = "<|channel|>analysis" if reasoning else "<|channel|>final"
        at = full.rindex("<|start|>assistant" + opener) + len("<|start|>assistant")
        return full[at:]
    if family == "kimi-k2.5" and thinking and not calls:
        turn = full.rsplit("<|im_assistant|>assistant<|im_middle|>", 1)[1]
        turn = turn.removeprefix("<think></think>")
        return f"{reasoning}</think>{turn[: turn.index(END[family]) + len(END[family])]}"
    if family.startswith("deepseek") and prompt.endswith("<｜tool▁outputs▁end｜>") and calls:
        # The prompt closes the tool results; the template writes a call turn unclosed.
        head = prompt.removesuffix("<｜tool▁outputs▁end｜>")
        return full[len(head) :].removeprefix("<｜Assistant｜>")
    if family == "deepseek-r1":
        tail = full[len(prompt) :]
        think = f"<think>\n{reasoning}\n</think>\n\n"  # R1 always opens its reasoning
        return think + tail[: tail.index(END[family]) + len(END[family])]
    if not full.startswith(prompt):
        # A template that cannot write this answer after this history (DeepSeek-V3/R1 never
        # reset the flag of their first call turn, so a second one loses its header): the
        # model writes it as the template writes such an answer after a lone user turn.
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not users or len(messages) == 1:
            raise ValueError(f"{family}: the template's prompt is not a prefix of its answer")
        return completion_text(family, users[-1:], tools, thinking, answer)
    tail = full[len(prompt) :]
    if family in GLM:
        return tail + ("<|observation|>" if calls else "<|user|>")
    return tail[: tail.index(END[family]) + len(END[family])]


def _harmony_call(reasoning: str, preamble: str, fn: dict[str, Any]) -> str:
    """A gpt-oss call as the model samples it: the recipient after the channel, after its
    analysis and a commentary preamble."""
    out = ""
    if reasoning:
        out = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"
    if preamble:
        out += f"<|channel|>commentary<|message|>{preamble}<|end|><|start|>assistant"
    return (
        f"{out}<|channel|>commentary to=functions.{fn['name']} <|constrain|>json"
        f"<|message|>{fn['arguments']}<|call|>"
    )
