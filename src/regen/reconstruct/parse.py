"""Parse a rebuilt completion back, as the servers' reasoning and tool-call parsers read model
output, and compare it with the answer that was stored: the audit's check for mistakes that
keep the token count (a `\\n\\n` that became `\\n\\n\\n` is one token either way).

`parse` splits the text the way vLLM's parsers do (qwen3 + hermes, deepseek_r1 / deepseek_v3 /
deepseek_v31, kimi_k2, glm45, harmony), which keep whitespace as the model wrote it. `server_form`
puts a stored answer in that same form: a provider that strips fields (OpenRouter's, older
SGLang) loses the newlines the chat template fixes, and those come back from the template's
layout. The two are written apart from the completion grammars in families.py, so a separator
that the grammar gets wrong shows up here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from regen.reconstruct.families import DS_EOS, FAMILIES, Answer, Family, call_parts


@dataclass(frozen=True)
class Parsed:
    reasoning: str
    content: str
    calls: tuple[tuple[str, Any], ...]
    """(name, arguments): parsed JSON where the arguments are JSON, else their text."""


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _calls(pairs: list[tuple[str, str]]) -> tuple[tuple[str, Any], ...]:
    return tuple((name.strip(), _args(args)) for name, args in pairs)


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_DS3 = re.compile(
    r"<｜tool▁call▁begin｜>(?:function)?<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```<｜tool▁call▁end｜>",
    re.S,
)
_DS31 = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)
_KIMI = re.compile(
    r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S
)
_GLM = re.compile(r"<tool_call>([^\n]*)\n(.*?)</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _hermes(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    i = text.find("<tool_call>")
    if i < 0:
        return text, ()
    pairs = []
    for body in _HERMES.findall(text[i:]):
        obj = _args(body.strip())
        if isinstance(obj, dict):
            pairs.append((str(obj.get("name", "")), obj.get("arguments")))
        else:
            pairs.append(("", body))
    return text[:i], tuple(pairs)


def _before(text: str, marker: str) -> tuple[str, str]:
    i = text.find(marker)
    return (text, "") if i < 0 else (text[:i], text[i:])


def _kimi_name(cid: str) -> str:
    """`functions.NAME:IDX` -> NAME (a name may hold dots: `functions.mcp.search:0`)."""
    return cid.removeprefix("functions.").rsplit(":", 1)[0]


def parse(family: str, text: str, a: Answer, stops: tuple[str, ...] = ()) -> Parsed:
    """The reasoning, content and calls a server's parsers read in a completion's text (its
    end-of-turn token included or not), given what the prompt pre-filled (`a.prefill`) and
    whether thinking was on. `stops`: the end tokens the rebuild ended the turn with (the
    target's, which a job's `[reconstruct] stop` or the tokenizer decides for a family that
    names none)."""
    f = FAMILIES.get(family)
    if f is not None and f.syntax == "none":
        # The generic family knows no tags to split by: its self-check, which compares the
        # stored fields as they are, is its parse-back.
        raise ValueError(f"no parser for family {family!r}")
    if f is not None and family not in LEGACY:
        return parse_syntax(f, text, stops or f.stop)
    for end in ("<|im_end|>", DS_EOS, "<|return|>", "<|call|>", "<|user|>", "<|observation|>"):
        text = text.removesuffix(end)
    reasoning = ""
    open_think = a.thinking and "</think>" not in a.prefill  # the model writes its reasoning
    if family in ("qwen3", "chatml"):
        if family == "qwen3" and open_think:
            reasoning, _, text = text.removeprefix("<think>").partition("</think>")
        content, calls = _hermes(text)
        return Parsed(reasoning, content, calls)
    if family in ("deepseek-v3", "deepseek-r1", "deepseek-v3.1"):
        if family == "deepseek-r1" or (family == "deepseek-v3.1" and a.prefill == "<think>"):
            reasoning, _, text = text.removeprefix("<think>").partition("</think>")
        content, section = _before(text, "<｜tool▁calls▁begin｜>")
        pattern = _DS31 if family == "deepseek-v3.1" else _DS3
        return Parsed(reasoning, content, _calls(pattern.findall(section)))
    if family in ("kimi-k2", "kimi-k2.5"):
        if text.startswith("<think>") or (family == "kimi-k2.5" and open_think):
            head, section = _before(text.removeprefix("<think>"), "<|tool_calls_section_begin|>")
            reasoning, sep, content = head.partition("</think>")
            if not sep:  # reasoning ended where the calls began
                reasoning, content = head, ""
            text = content + section
        content, section = _before(text, "<|tool_calls_section_begin|>")
        pairs = [(_kimi_name(cid), args) for cid, args in _KIMI.findall(section)]
        return Parsed(reasoning, content, _calls(pairs))
    if family == "glm-4.5":
        if a.thinking and "</think>" in text:
            head, _, text = text.partition("</think>")
            reasoning = head.partition("<think>")[2]
        content, section = _before(text, "<tool_call>")
        pairs = []
        for name, body in _GLM.findall(section):
            args = {k.strip(): v for k, v in _GLM_ARG.findall(body)}  # compared as text
            pairs.append((name, args))
        return Parsed(reasoning, content, tuple((n.strip(), a) for n, a in pairs))
    if family == "gpt-oss":
        return _harmony(text)
    raise ValueError(f"no parser for family {family!r}")


LEGACY = frozenset(
    {"qwen3", "chatml", "deepseek-v3", "deepseek-r1", "deepseek-v3.1", "kimi-k2", "kimi-k2.5",
     "glm-4.5", "gpt-oss"}
)  # fmt: skip
"""Families parsed with their whitespace rules above; the others by their call syntax."""

_XML_NAME = re.compile(r"<tool_call>\s*(.*?)\s*(?=<arg_key>|</tool_call>)", re.S)
_MINIMAX_INVOKE = re.compile(r'<invoke name="(.*?)">(.*?)</invoke>', re.S)
_MINIMAX_PARAM = re.compile(r'<parameter name="(.*?)">(.*?)</parameter>', re.S)
_QWEN_FUNCTION = re.compile(r"<function=(.*?)>(.*?)</function>", re.S)
_QWEN_PARAM = re.compile(r"<parameter=(.*?)>(.*?)</parameter>", re.S)


def _one_newline(v: str) -> str:
    """A Qwen XML value as vLLM and SGLang read it: one newline off each end."""
    return v.removeprefix("\n").removesuffix("\n")


def _syntax_calls(syntax: str, text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """(content, calls) as the server's tool parser for `syntax` reads them; XML values as
    text (compared with `same_value`)."""
    if syntax == "hermes":
        return _hermes(text)
    if syntax == "glm":
        content, section = _before(text, "<tool_call>")
        calls = []
        for body in re.findall(r"<tool_call>.*?</tool_call>", section, re.S):
            name = _XML_NAME.match(body)
            args = {k.strip(): v for k, v in _GLM_ARG.findall(body)}
            calls.append((name.group(1) if name else "", args))
        return content, tuple(calls)
    if syntax == "minimax":
        content, section = _before(text, "<minimax:tool_call>")
        return content, tuple(
            (name, dict(_MINIMAX_PARAM.findall(body)))
            for name, body in _MINIMAX_INVOKE.findall(section)
        )
    if syntax == "qwen-xml":
        content, section = _before(text, "<tool_call>")
        return content, tuple(
            (name.strip(), {k: _one_newline(v) for k, v in _QWEN_PARAM.findall(body)})
            for name, body in _QWEN_FUNCTION.findall(section)
        )
    if syntax == "kimi-k3":
        return _kimi_k3(text)
    if syntax == "dsml":
        return _dsml(text)
    if syntax == "mistral":
        return _mistral(text)
    if syntax == "llama4":
        return _llama4(text)
    return text, ()


def _llama4(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """Llama 4's calls as vLLM's parsers read model output: only where the text (after a
    leading `<|python_start|>`, its `<|python_end|>` dropped) begins with them and is nothing
    else. Either JSON objects `{"name": ..., "parameters": {...}}` one after another (Meta's
    template; llama3_json), or a Python list `[f(k="v"), g()]` of plain names called with
    keyword arguments whose values are literals (vLLM's template; llama4_pythonic, which
    reads it with `ast`). Anything else, text before the calls included, is content."""
    body = text
    if body.startswith("<|python_start|>"):
        body = body.removeprefix("<|python_start|>").replace("<|python_end|>", "")
    calls = _json_calls(body) if body.startswith("{") else _pythonic(body)
    return ("", calls) if calls else (text, ())


def _json_calls(body: str) -> tuple[tuple[str, Any], ...]:
    decoder, calls, rest = json.JSONDecoder(), [], body
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            return ()
        if not isinstance(obj, dict) or "name" not in obj:
            return ()
        calls.append((str(obj["name"]), obj.get("parameters", obj.get("arguments"))))
        rest = rest[end:].lstrip()
    return tuple(calls)


def _pythonic(body: str) -> tuple[tuple[str, Any], ...]:
    import ast

    def literal(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [literal(e) for e in node.elts]
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
            return {k.value: literal(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
        raise ValueError("not a literal")

    if not body.startswith("["):
        return ()
    try:
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return ()
        calls = []
        for c in tree.elts:
            if not isinstance(c, ast.Call) or not isinstance(c.func, ast.Name) or c.args:
                return ()
            calls.append((c.func.id, {str(k.arg): literal(k.value) for k in c.keywords}))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    return tuple(calls)


_MISTRAL_CALL = re.compile(r"\[TOOL_CALLS\](.*?)(?:\[CALL_ID\].*?)?\[ARGS\]", re.S)


def _mistral(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """Mistral's calls as vLLM's mistral parser reads them: from v11 on,
    `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` for each call (no call id from v13 on); before
    it, one `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`."""
    content, section = _before(text, "[TOOL_CALLS]")
    if not section:
        return text, ()
    heads = list(_MISTRAL_CALL.finditer(section))
    if not heads:  # v3-v7: a JSON list
        listed = _args(section.removeprefix("[TOOL_CALLS]").strip())
        if not isinstance(listed, list):
            return content, (("", section),)
        return content, tuple(
            (str(c.get("name", "")), c.get("arguments")) if isinstance(c, dict) else ("", c)
            for c in listed
        )
    calls = []
    for m, after in zip(heads, [*heads[1:], None], strict=True):
        end = after.start() if after is not None else len(section)
        calls.append((m.group(1).strip(), _args(section[m.end() : end])))
    return content, tuple(calls)


# V3.2 `function_calls`, V4 `tool_calls`, V4.1 ` calls` (its DSML token, a space, the word).
_DSML_BLOCK = re.compile(r"<｜DSML｜(?:tool_calls|function_calls| calls)>")
_DSML_INVOKE = re.compile(r'<｜DSML｜ ?invoke name="(.*?)">(.*?)</｜DSML｜ ?invoke>', re.S)
_DSML_PARAM = re.compile(
    r'<｜DSML｜ ?parameter name="(.*?)" string="(true|false)">(.*?)</｜DSML｜ ?parameter>', re.S
)


def _dsml(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """DeepSeek's DSML calls (V3.2 `function_calls`, V4 `tool_calls`, V4.1 ` calls`): a
    parameter marked `string="true"` is its text, any other is JSON."""
    block = _DSML_BLOCK.search(text)
    if block is None:
        return text, ()
    calls = tuple(
        (
            name,
            {
                k: v if is_text == "true" else _args(v)
                for k, is_text, v in _DSML_PARAM.findall(body)
            },
        )
        for name, body in _DSML_INVOKE.findall(text[block.start() :])
    )
    # The encoder writes `\n\n` before the block: its separator, not the content's.
    return text[: block.start()].removesuffix("\n\n"), calls


_K3_CALL = re.compile(
    r'<\|open\|>call tool="(.*?)"[^<]*<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', re.S
)
_K3_ARG = re.compile(
    r'<\|open\|>argument key="(.*?)" type="(.*?)"<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>', re.S
)
_K3_JSON = re.compile(r"<\|open\|>json[^<]*<\|sep\|>(.*?)<\|close\|>json<\|sep\|>", re.S)


def _unescape_attr(v: str) -> str:
    return v.replace("&quot;", '"').replace("&amp;", "&")


def _kimi_k3(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """Kimi K3's tags: the response's text, then each call's typed arguments (a string
    argument is its text, any other JSON) or one JSON object."""
    # The response channel's text (its opening tag pre-filled when thinking is off).
    head = text.partition("<|open|>tools<|sep|>")[0]
    content = head.partition("<|open|>response<|sep|>")[2] or head
    content = content.partition("<|close|>response<|sep|>")[0]
    calls: list[tuple[str, Any]] = []
    for name, body in _K3_CALL.findall(text):
        block = _K3_JSON.search(body)
        if block:
            calls.append((_unescape_attr(name), _args(block.group(1))))
            continue
        args = {
            _unescape_attr(k): v if kind == "string" else _args(v)
            for k, kind, v in _K3_ARG.findall(body)
        }
        calls.append((_unescape_attr(name), args))
    return content, tuple(calls)


def parse_syntax(f: Family, text: str, stops: tuple[str, ...]) -> Parsed:
    """A template family's completion read back: the end token off, reasoning up to the
    closing think tag (its opening one may have been pre-filled), then the call syntax."""
    for end in (*stops, f.append_stop, f.append_stop_after_calls):
        if end:
            text = text.removesuffix(end)
    reasoning = ""
    opening, closing = f.think
    if closing in text:
        head, _, text = text.partition(closing)
        reasoning = head.partition(opening)[2] if opening in head else head
    content, calls = _syntax_calls(f.syntax, text)
    return Parsed(reasoning, content, calls)


def same_value(text: Any, stored: Any) -> bool:
    """Whether an argument value read back as text is the stored one: text as it is, else
    JSON, else a Python literal (what the servers' XML parsers try, in that order)."""
    if not isinstance(text, str) or isinstance(stored, str):
        return bool(text == stored)
    import ast

    for read in (json.loads, ast.literal_eval):
        try:
            if read(text) == stored:
                return True
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False


def _glm_text(args: Any) -> Any:
    if not isinstance(args, dict):
        return args
    return {
        k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in args.items()
    }


_HEADER_TO = re.compile(r"to=(\S+)")


def _harmony(text: str) -> Parsed:
    """Harmony messages: analysis is the reasoning, final (or a commentary preamble) the
    content, a message to `functions.NAME` (recipient in the header, before or after the
    channel) a call."""
    reasoning, content, calls = "", "", []
    for message in re.split(r"<\|start\|>assistant", text):
        message = message.removesuffix("<|end|>").removesuffix("<|call|>")
        header, sep, body = message.partition("<|message|>")
        if not sep:
            continue
        body = body.removesuffix("<|end|>")
        to = _HEADER_TO.search(header)
        if to and to.group(1).startswith("functions."):
            calls.append((to.group(1).removeprefix("functions."), _args(body)))
        elif "<|channel|>analysis" in header:
            reasoning = body
        else:
            content = body
    return Parsed(reasoning, content, tuple(calls))


def _sep(body: str, calls: bool) -> str:
    """The newline Qwen's templates put between text and a first call."""
    return "\n" if calls and body and not body.endswith("\n") else ""


def server_form(family: str, a: Answer) -> Parsed:
    """A stored answer as a whitespace-keeping parser returns it for the text the model writes
    (the chat template's layout) after what the prompt pre-filled. For a family the template
    writes, the template's whitespace is its own: fields compare stripped (first_difference)."""
    calls = tuple((name, _args(args)) for name, args in map(call_parts, a.calls))
    if family not in LEGACY:
        return Parsed(a.reasoning, a.content, calls)
    r, c = a.reasoning, a.content
    open_think = a.thinking and "</think>" not in a.prefill
    if family == "qwen3" and open_think:
        r = ("" if r.startswith("\n") else "\n") + r + ("" if r.endswith("\n") else "\n")
        r = r.removeprefix("\n") if a.prefill.endswith("\n") else r
        c = c if c.startswith("\n") else "\n\n" + c
        return Parsed(r, c + _sep(c, bool(calls)), calls)
    if family in ("qwen3", "chatml"):
        return Parsed("", c + _sep(c, bool(calls)), calls)
    if family == "deepseek-r1":
        head = "" if a.prefill or r.startswith("\n") else "\n"  # after a `<think>` it wrote
        r = head + (r if r.endswith("\n") else r + "\n")
        return Parsed(r, c if c.startswith("\n") else "\n\n" + c, calls)
    if family == "deepseek-v3.1":
        return Parsed(r if a.prefill == "<think>" else "", c, calls)
    if family == "glm-4.5":
        # Values as the model writes them, text as it is and others as JSON.
        calls = tuple((n, _glm_text(a)) for n, a in calls)
        body = "\n" + c.strip() if c.strip() else ""
        return Parsed(r.strip() if a.thinking else "", body + ("\n" if calls else ""), calls)
    if family == "deepseek-v3":
        return Parsed("", c, calls)
    if family == "kimi-k2.5" and not open_think:
        return Parsed("", c, calls)
    return Parsed(r, c, calls)


def first_difference(got: Parsed, want: Parsed, strip: bool = False) -> str | None:
    """Where a parsed completion first differs from the stored answer, in one line (`strip`:
    a stored field without outer whitespace, as a provider strips it, is compared with the
    rebuilt one stripped; one with whitespace is what a server's parser kept, compared as it
    is; XML argument values are read as the servers read them)."""
    for name in ("reasoning", "content"):
        g, w = getattr(got, name), getattr(want, name)
        if strip and w == w.strip():  # a stored field with its whitespace is compared as is
            g = g.strip()
        if g != w:
            at = next((i for i, (x, y) in enumerate(zip(g, w, strict=False)) if x != y), None)
            at = min(len(g), len(w)) if at is None else at
            return (
                f"{name} differs at character {at}: rebuilt {g[at : at + 12]!r}, "
                f"stored {w[at : at + 12]!r} ({len(g)} vs {len(w)} characters)"
            )
    if len(got.calls) != len(want.calls):
        return f"{len(got.calls)} tool calls rebuilt, {len(want.calls)} stored"
    for i, (g, w) in enumerate(zip(got.calls, want.calls, strict=True)):
        if g != w and not (strip and _same_call(g, w)):
            return f"tool call {i}: rebuilt {g!r}, stored {w!r}"
    return None


def _same_call(got: tuple[str, Any], want: tuple[str, Any]) -> bool:
    (gn, ga), (wn, wa) = got, want
    if gn != wn:
        return False
    if isinstance(ga, dict) and isinstance(wa, dict):
        return ga.keys() == wa.keys() and all(same_value(ga[k], wa[k]) for k in ga)
    return bool(ga == wa)
