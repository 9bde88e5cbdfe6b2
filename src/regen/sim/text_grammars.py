"""The simulator's other model families, parsed as text the way a server's reasoning and
tool-call parsers read it: Kimi-K2, Kimi-K3, DeepSeek-V3 and R1, GLM-4.5 and GLM-4.7,
MiniMax-M2, Qwen3-Coder, Qwen3.5, Llama 4 (pythonic calls), gpt-oss (harmony) and plain
ChatML. Like grammar.py, this is
the simulator's own code, apart from regen's reconstruction.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tokenizers import Tokenizer

from regen.sim.tokens import Call, Parsed, encode_words, special_id


class TextGrammar:
    """A server's parser of a family's completions: text, then one end-of-turn token."""

    name = ""
    ends: tuple[str, ...] = ()

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.end_ids = {special_id(tok, t): t for t in self.ends}

    # to override
    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        raise NotImplementedError

    def parse(self, ids: list[int], thinking: bool, tools: list[Any] | None = None) -> Parsed:
        complete = bool(ids) and ids[-1] in self.end_ids
        body = ids[:-1] if complete else ids
        reasoning, content, calls = self.split(
            self.tok.decode(body, skip_special_tokens=False), thinking, tools
        )
        n_reasoning = len(encode_words(self.tok, reasoning)) if reasoning else 0
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

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
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

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        content, _, section = text.partition("<｜tool▁calls▁begin｜>")
        return "", content, [Call(n, a) for n, a in _DS_CALL.findall(section)]


class DeepSeekR1(DeepSeekV3):
    """The prompt pre-fills `<think>\\n`; the model writes its reasoning, `</think>`, then the
    answer. The server splits at `</think>` and keeps both sides verbatim."""

    name = "deepseek-r1"
    think_prefill = "<think>\n"

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        reasoning, sep, rest = text.removeprefix("<think>").partition("</think>")
        if not sep:
            return reasoning, "", []
        _, content, calls = super().split(rest, thinking, tools)
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

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
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

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
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

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
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


# The XML call formats ---------------------------------------------------------------------
# GLM-4.7, MiniMax-M2, Qwen3-Coder and Qwen3.5 write each argument's value as text. vLLM's
# glm4_moe, minimax_m2 and qwen3coder parsers give it back as JSON by the tool's schema: a
# value declared a string stays the text; any other value is parsed when it parses.


def _declared_types(tools: list[Any] | None, name: str) -> dict[str, Any]:
    """Each argument's declared `type` in the schema of the request's tool `name`."""
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            if isinstance(props, dict):
                return {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return {}


_PY_LITERALS = {"True": True, "False": False, "None": None}


def _xml_value(text: str, declared: Any) -> Any:
    """A value declared a string is the text; any other is its JSON when it parses, or one
    of Python's `True`, `False`, `None` (Qwen's templates write a value with `str()`; vLLM's
    glm4_moe parser falls back on `ast.literal_eval`, qwen3coder reads a declared boolean
    case-blind); else the text."""
    if declared == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _PY_LITERALS.get(text, text)


def _xml_call(name: str, pairs: list[tuple[str, str]], tools: list[Any] | None) -> Call:
    types = _declared_types(tools, name)
    args = {k: _xml_value(v, types.get(k)) for k, v in pairs}
    return Call(name, json.dumps(args, ensure_ascii=False))


def _one_newline(text: str) -> str:
    """vLLM's qwen3coder parser drops one newline on each side of a value (glm4_moe and
    minimax_m2 strip all whitespace)."""
    return text.removeprefix("\n").removesuffix("\n")


def _after_think(text: str, thinking: bool) -> tuple[str, str]:
    """(reasoning, the rest) when the prompt opened the think block: the reasoning runs to
    `</think>`, verbatim (a completion cut before it is all reasoning)."""
    if not thinking:
        return "", text
    reasoning, sep, rest = text.removeprefix("<think>").partition("</think>")
    return (reasoning, rest) if sep else (reasoning, "")


# GLM-4.7 -----------------------------------------------------------------------------------

_GLM47_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_GLM47_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


class Glm47(TextGrammar):
    """`<|assistant|><think>` pre-filled (`<|assistant|></think>` with thinking off); the model
    writes `{reasoning}</think>{content}<tool_call>NAME<arg_key>K</arg_key><arg_value>V
    </arg_value>...</tool_call>` with no newlines, and stops on `<|observation|>` after calls,
    on `<|user|>` otherwise."""

    name = "glm-4.7"
    ends = ("<|user|>", "<|observation|>", "<|endoftext|>")

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        reasoning, text = _after_think(text, thinking)
        content, _, _ = text.partition("<tool_call>")
        calls = []
        for body in _GLM47_CALL.findall(text):
            name = body.split("<arg_key>", 1)[0].strip()
            pairs = [(k.strip(), v.strip()) for k, v in _GLM47_ARG.findall(body)]
            calls.append(_xml_call(name, pairs, tools))
        return reasoning, content, calls


# MiniMax-M2 --------------------------------------------------------------------------------

_MINIMAX_SECTION = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.S)
_MINIMAX_INVOKE = re.compile(r'<invoke name="(.*?)">(.*?)</invoke>', re.S)
_MINIMAX_PARAM = re.compile(r'<parameter name="(.*?)">(.*?)</parameter>', re.S)


class MiniMaxM2(TextGrammar):
    """`]~b]ai\\n<think>\\n` pre-filled, always; the model writes `{reasoning}\\n</think>\\n\\n
    {content}`, then its calls as `\\n<minimax:tool_call>\\n<invoke name="N">\\n<parameter
    name="K">V</parameter>\\n</invoke>\\n</minimax:tool_call>`, and stops on `[e~[`."""

    name = "minimax-m2"
    ends = ("[e~[",)

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        reasoning, text = _after_think(text, True)  # no switch: the prompt always opens it
        content, _, _ = text.partition("<minimax:tool_call>")
        calls = [
            _xml_call(name, [(k, v.strip()) for k, v in _MINIMAX_PARAM.findall(body)], tools)
            for section in _MINIMAX_SECTION.findall(text)
            for name, body in _MINIMAX_INVOKE.findall(section)
        ]
        return reasoning, content, calls


# Qwen3-Coder and Qwen3.5 -------------------------------------------------------------------

_QWEN_XML_CALL = re.compile(r"<tool_call>\s*<function=(.*?)>(.*?)</function>\s*</tool_call>", re.S)
_QWEN_XML_PARAM = re.compile(r"<parameter=(.*?)>(.*?)</parameter>", re.S)


class Qwen3Coder(TextGrammar):
    """ChatML without thinking; calls as `<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n
    </parameter>\\n</function>\\n</tool_call>`, then `<|im_end|>`."""

    name = "qwen3-coder"
    ends = ("<|im_end|>",)

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        return "", *self._calls(text, tools)

    @staticmethod
    def _calls(text: str, tools: list[Any] | None) -> tuple[str, list[Call]]:
        content, _, _ = text.partition("<tool_call>")
        calls = [
            _xml_call(name, [(k, _one_newline(v)) for k, v in _QWEN_XML_PARAM.findall(body)], tools)
            for name, body in _QWEN_XML_CALL.findall(text)
        ]
        return content, calls


class Qwen35(Qwen3Coder):
    """`<|im_start|>assistant\\n<think>\\n` pre-filled (with thinking off, an empty think block
    `<think>\\n\\n</think>\\n\\n`); the model writes `{reasoning}\\n</think>\\n\\n{content}`, then
    Qwen3-Coder's calls (the first after content preceded by `\\n\\n`), then `<|im_end|>`."""

    name = "qwen3.5"

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        reasoning, text = _after_think(text, thinking)
        return reasoning, *self._calls(text, tools)


# Kimi-K3 -----------------------------------------------------------------------------------

_K3_CALL = re.compile(
    r'<\|open\|>call tool="(.*?)" index="\d+"<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', re.S
)
_K3_ARG = re.compile(
    r'<\|open\|>argument key="(.*?)" type="(\w+)"<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>'
    r'|<\|open\|>json type="object"<\|sep\|>(.*?)<\|close\|>json<\|sep\|>',
    re.S,
)


def _unescape_attr(v: str) -> str:
    return v.replace("&quot;", '"').replace("&amp;", "&")


class KimiK3(TextGrammar):
    """Tags `<|open|>TAG attrs<|sep|>...<|close|>TAG<|sep|>`. The prompt opens the answer's
    `think` block (its `response` one with thinking off); the model writes `{reasoning}
    <|close|>think<|sep|><|open|>response<|sep|>{content}<|close|>response<|sep|>`, then its
    calls in a `tools` block (each argument typed: `type="string"` is the text, others JSON),
    then `<|close|>message<|sep|>` and the stop token `<|end_of_msg|>`."""

    name = "kimi-k3"
    ends = ("<|end_of_msg|>",)

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        reasoning = ""
        if thinking:
            reasoning, sep, text = text.partition("<|close|>think<|sep|>")
            if not sep:
                return reasoning, "", []
        text = text.removeprefix("<|open|>response<|sep|>")
        content, _, section = text.partition("<|close|>response<|sep|>")
        calls = []
        for name, body in _K3_CALL.findall(section):
            args: dict[str, Any] = {}
            for key, kind, value, block in _K3_ARG.findall(body):
                if key or kind:
                    args[_unescape_attr(key)] = _xml_value(value, kind)
                else:
                    try:
                        obj = json.loads(block)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(obj, dict):
                        args.update(obj)
            calls.append(Call(_unescape_attr(name), json.dumps(args, ensure_ascii=False)))
        return reasoning, content, calls


# Llama 4 -----------------------------------------------------------------------------------


_LETTER = re.compile(r"[A-Za-z]")


def _literal(node: ast.expr) -> Any:
    """An argument's value as vLLM's pythonic parsers take it: a constant, or a list or dict
    (with constant keys) of them; anything else (a name, `-1`, a call) is no literal."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if not isinstance(k, ast.Constant):
                raise ValueError("a dict argument's keys must be literals")
            out[k.value] = _literal(v)
        return out
    raise ValueError("a call argument must be a literal")


def _pythonic_calls(text: str) -> list[Call] | None:
    """The calls of a completion that is a Python list of calls, `[f(k="v"), g()]`, each a
    plain name (starting with a letter) called with keyword arguments (each starting with a
    letter) whose values are literals, or None. Read as vLLM's llama4_pythonic parser reads
    it: the first statement of the text parsed as Python (`ast`), the arguments serialized
    with `json.dumps` (ASCII escapes)."""
    if not text.startswith("["):
        return None
    try:
        body = ast.parse(text).body
        node = body[0].value if body and isinstance(body[0], ast.Expr) else None
        if not isinstance(node, ast.List):
            return None
        calls = []
        for c in node.elts:
            if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name)) or c.args:
                return None
            keys = [k.arg for k in c.keywords]
            if not _LETTER.match(c.func.id) or any(k is None or not _LETTER.match(k) for k in keys):
                return None
            args = {k.arg: _literal(k.value) for k in c.keywords}
            calls.append(Call(c.func.id, json.dumps(args)))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return calls


class Llama4(TextGrammar):
    """vLLM's pythonic template (`--tool-call-parser llama4_pythonic`): no thinking; the model
    writes `{content}` or its calls as a Python list, `[get_weather(city="Paris", days="3")]`
    (the template writes every value as quoted text, `"%s"|format(v)`), then `<|eot|>`. The
    parser reads calls only when the text (after a `<|python_start|>`, with `<|python_end|>`
    dropped) is such a list from its first character: text before the list, or a list it
    cannot read, leaves the whole answer content."""

    name = "llama4"
    ends = ("<|eot|>", "<|eom|>", "<|end_of_text|>")

    def split(
        self, text: str, thinking: bool, tools: list[Any] | None
    ) -> tuple[str, str, list[Call]]:
        if text.startswith("<|python_start|>"):
            text = text.removeprefix("<|python_start|>").replace("<|python_end|>", "")
        calls = _pythonic_calls(text)
        return ("", "", calls) if calls else ("", text, [])


TEXT_GRAMMARS: dict[str, type[TextGrammar]] = {
    g.name: g
    for g in (
        KimiK2,
        KimiK3,
        DeepSeekV3,
        DeepSeekR1,
        Glm45,
        Glm47,
        MiniMaxM2,
        Qwen3Coder,
        Qwen35,
        Llama4,
        GptOss,
        ChatML,
    )
}
