"""Row formats to Conversation.

An adapter takes one row (a dict as the reader gave it) and returns the messages and the tools
list, or raises RowError saying why the row cannot be used; adapt_row turns that into a BadRow,
so no row content ever raises out of here. The families and their quirks are described in
docs/sources.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from regen.conversation import ROLES, BadRow, Conversation, Message, ToolCall

Parsed = tuple[tuple[Message, ...], tuple[dict[str, Any], ...]]
Adapter = Callable[[dict[str, Any]], Parsed]


class RowError(ValueError):
    """Why one row cannot be used."""


# --- shared helpers -------------------------------------------------------------------------


def _text(value: Any, where: str) -> str:
    """A string field; a list of OpenAI content parts is joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = []
        for k, p in enumerate(value):
            if p.get("type", "text") != "text":
                raise RowError(f"{where}[{k}] is a {p.get('type')!r} part; only text is supported")
            parts.append(_text(p.get("text"), f"{where}[{k}].text"))
        return "".join(parts)
    raise RowError(f"{where} is {type(value).__name__}, expected a string")


def _as_list(value: Any, where: str) -> list[Any]:
    """A list field; many hub datasets keep one as a JSON string, which is parsed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(f"'{where}' is a string but not valid JSON: {exc}") from exc
    if not isinstance(value, list):
        raise RowError(f"'{where}' is {type(value).__name__}, expected a list")
    return value


def _list(row: Mapping[str, Any], *keys: str) -> tuple[str, list[Any]]:
    """The first of `keys` the row has, as a list."""
    for key in keys:
        if key in row and row[key] is not None:
            return key, _as_list(row[key], key)
    raise RowError(f"missing {' or '.join(repr(k) for k in keys)} list")


def _tools(row: Mapping[str, Any], key: str = "tools") -> tuple[dict[str, Any], ...]:
    tools = row.get(key)
    if tools is None or tools == "" or tools == []:
        return ()
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise RowError(f"'{key}' is not valid JSON: {exc}") from exc
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError(f"'{key}' must be a list of objects")
    # A bare function definition is wrapped the way the API wants it.
    return unique_tools(
        [t if "function" in t else {"type": "function", "function": t} for t in tools], key
    )


def unique_tools(tools: list[dict[str, Any]], where: str) -> tuple[dict[str, Any], ...]:
    """The tools with a function declared twice in the same words kept once; two different
    definitions under one name are refused (a call to it could be held to either, and
    providers refuse duplicate names)."""
    seen: dict[str, dict[str, Any]] = {}
    out = []
    for t in tools:
        fn = t.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            out.append(t)
            continue
        if name in seen:
            if seen[name] != t:
                raise RowError(f"'{where}' declares function {name!r} twice, differently")
            continue
        seen[name] = t
        out.append(t)
    return tuple(out)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


MISSING = object()


def object_arguments(args: Any, where: str) -> str:
    """A call's arguments as the JSON text of an object, as every server takes them: a JSON
    string is kept verbatim once it reads as an object; an object is serialized; an empty
    string, or arguments left out (MISSING), is `{}`. Anything else (a list, a number, `null`,
    `NaN`/`Infinity`, broken JSON) is refused: a provider would refuse it at send time."""
    if args is MISSING or args == "":
        return "{}"
    if isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False, allow_nan=False)
        return text
    if not isinstance(args, str):
        raise RowError(f"{where}: arguments are a {type(args).__name__}, not a JSON object")
    try:
        value = json.loads(args, parse_constant=_reject_constant)
    except ValueError as exc:
        raise RowError(f"{where}: arguments are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RowError(f"{where}: arguments are a JSON {type(value).__name__}, not an object")
    return args


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RowError(f"{where}.tool_calls is not valid JSON: {exc}") from exc
    if not isinstance(raw, list) or not all(isinstance(tc, dict) for tc in raw):
        raise RowError(f"{where}.tool_calls must be a list of objects")
    calls = []
    for k, tc in enumerate(raw):
        fn = tc["function"] if isinstance(tc.get("function"), dict) else tc  # or flat
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RowError(f"{where}.tool_calls has a call without a function name")
        args = fn["arguments"] if "arguments" in fn else fn.get("parameters", MISSING)
        text = object_arguments(args, f"{where}.tool_calls[{k}] ({name})")
        calls.append(ToolCall(str(tc.get("id") or ""), name, text))
    return tuple(calls)


def _system(row: Mapping[str, Any], key: str = "system") -> list[Message]:
    system = row.get(key)
    if isinstance(system, str) and system.strip():
        return [Message("system", system)]
    return []


THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
THOUGHT = re.compile(
    r"^\s*<\|begin_of_thought\|>(.*?)<\|end_of_thought\|>\s*"
    r"(?:<\|begin_of_solution\|>(.*?)(?:<\|end_of_solution\|>\s*)?)?$",
    re.DOTALL,
)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of an answer that carries its reasoning inline: `<think>…</think>`
    (Mixture-of-Thoughts, OpenThoughts3) or the OpenThoughts-114k thought/solution markers."""
    m = THINK.match(text)
    if m:
        return m.group(1).strip("\n"), text[m.end() :]
    m = THOUGHT.match(text)
    if m:
        return m.group(1).strip("\n"), (m.group(2) or "").strip("\n")
    return None, text


def _reasoned(role: str, text: str) -> Message:
    if role != "assistant":
        return Message(role, text)
    reasoning, answer = split_reasoning(text)
    return Message(role, answer, reasoning=reasoning)


# --- OpenAI messages --------------------------------------------------------------------------


def _openai_list(
    msgs: list[Any], field: str, roles: Mapping[str, str] | None = None
) -> list[Message]:
    out = []
    for i, m in enumerate(msgs):
        # Where a message is (`messages[3]`) is spelt out only for an error: this runs for
        # every message of every row.
        if not isinstance(m, dict):
            raise RowError(f"{field}[{i}] is not an object")
        raw_role = m.get("role")
        role = roles.get(str(raw_role), raw_role) if roles else raw_role
        if role not in ROLES:
            raise RowError(f"{field}[{i}].role is {raw_role!r} (allowed: {', '.join(ROLES)})")
        reasoning = m.get("reasoning", m.get("reasoning_content"))
        content = m.get("content")
        if type(content) is not str:
            content = _text(content, f"{field}[{i}].content")
        calls = m.get("tool_calls") if role == "assistant" else None
        name = m.get("name")
        out.append(
            Message(
                role,
                content,
                _text(reasoning, f"{field}[{i}].reasoning") if reasoning else None,
                _tool_calls(calls, f"{field}[{i}]") if calls else (),
                _result_of(m) if role == "tool" else None,
                name if isinstance(name, str) else None,
            )
        )
    return _patch_tool_call_ids(out)


def _result_of(m: dict[str, Any]) -> str | None:
    """The call a tool result answers: `tool_call_id`, or SWE-agent's one-item
    `tool_call_ids`."""
    ids = m.get("tool_call_ids")
    if m.get("tool_call_id") is None and isinstance(ids, list) and len(ids) == 1:
        return _str_or_none(ids[0])
    return _str_or_none(m.get("tool_call_id"))


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _patch_tool_call_ids(msgs: list[Message]) -> list[Message]:
    """Tool results without a tool_call_id get the id of the call they answer, in order (some
    trajectory sets drop it); calls without an id get a stable synthetic one."""
    out: list[Message] = []
    open_calls: list[str] = []
    for turn, m in enumerate(msgs):
        if m.tool_calls:
            calls = tuple(
                tc if tc.id else ToolCall(f"call_{turn}_{k}", tc.name, tc.arguments)
                for k, tc in enumerate(m.tool_calls)
            )
            m = Message(m.role, m.content, m.reasoning, calls, m.tool_call_id, m.name)
            open_calls = [tc.id for tc in calls]
        elif m.role == "tool":
            if m.tool_call_id is None:
                if not open_calls:
                    raise RowError(f"message {turn} is a tool result with no call before it")
                m = Message("tool", m.content, None, (), open_calls[0], m.name)
            if m.tool_call_id in open_calls:
                open_calls.remove(m.tool_call_id)
        out.append(m)
    return out


def openai_messages(row: dict[str, Any]) -> Parsed:
    """`{"messages": [{"role", "content", "tool_calls"?, ...}], "tools"?}`."""
    field, msgs = _list(row, "messages", "conversations")
    return tuple(_openai_list(msgs, field)), _tools(row)


def openai_batch(row: dict[str, Any]) -> Parsed:
    """An OpenAI Batch API input line: `{"custom_id", "method", "url", "body": {"messages",
    "tools"?}}`; the `custom_id` is kept as the row's id (source_id)."""
    body = row.get("body")
    if not isinstance(body, dict):
        raise RowError("'body' is not an object")
    field, msgs = _list(body, "messages")
    return tuple(_openai_list(msgs, f"body.{field}")), _tools(body)


# --- ShareGPT ----------------------------------------------------------------------------------

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


def _sharegpt_turns(row: dict[str, Any], reasoned: bool) -> list[Message]:
    field, turns = _list(row, "conversations", "items", "conversation")
    out = _system(row)
    for i, t in enumerate(turns):
        where = f"{field}[{i}]"
        if not isinstance(t, dict):
            raise RowError(f"{where} is not an object")
        speaker = t.get("from", t.get("role"))
        role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
        if role is None:
            raise RowError(f"{where}.from is {speaker!r}, not a known speaker")
        value = _text(t.get("value", t.get("content")), f"{where}.value")
        if str(speaker).lower() == "function_call":
            # LLaMA-Factory's glaive conversion: the value is the call as JSON.
            out.append(Message("assistant", "", tool_calls=(_call_from_json(value, where, i),)))
        elif reasoned:
            out.append(_reasoned(role, value))
        else:
            out.append(Message(role, value))
    return _patch_tool_call_ids(out)


def sharegpt(row: dict[str, Any]) -> Parsed:
    """`{"conversations": [{"from": "human"|"gpt"|..., "value"}], "system"?, "tools"?}`."""
    return tuple(_sharegpt_turns(row, reasoned=False)), _tools(row)


# --- single-turn instruction sets ----------------------------------------------------------------


def _pair(row: dict[str, Any], prompt: str, answer: str, system: str | None = None) -> Parsed:
    question = _text(row.get(prompt), prompt)
    if not question.strip():
        raise RowError(f"missing '{prompt}'")
    out = _system(row, system) if system else []
    out.append(Message("user", question))
    output = _text(row.get(answer), answer)
    if output:
        out.append(_reasoned("assistant", output))
    return tuple(out), ()


def alpaca(row: dict[str, Any]) -> Parsed:
    """`{"instruction", "input"?, "output"?, "system"?}`."""
    instruction = _text(row.get("instruction"), "instruction")
    if not instruction.strip():
        raise RowError("missing 'instruction'")
    extra = _text(row.get("input"), "input")
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    out = _system(row)
    out.append(Message("user", prompt))
    output = _text(row.get("output"), "output")
    if output:
        out.append(Message("assistant", output))
    return tuple(out), ()


def opencodeinstruct(row: dict[str, Any]) -> Parsed:
    """nvidia/OpenCodeInstruct: `input` is the question, `output` the original answer."""
    return _pair(row, "input", "output")


def magicoder(row: dict[str, Any]) -> Parsed:
    """Magicoder Evol-Instruct (`instruction`/`response`) or OSS-Instruct (`problem`/
    `solution`; its `seed` snippet is context, not the prompt)."""
    if "problem" in row:
        return _pair(row, "problem", "solution")
    if "instruction" in row:
        return _pair(row, "instruction", "response")
    raise RowError("missing 'problem' (OSS-Instruct) or 'instruction' (Evol-Instruct)")


# --- reasoning sets --------------------------------------------------------------------------


def mixture_of_thoughts(row: dict[str, Any]) -> Parsed:
    """open-r1/Mixture-of-Thoughts: OpenAI messages; the answer carries `<think>…</think>`."""
    field, msgs = _list(row, "messages")
    out = [
        _reasoned(m.role, m.content) if m.role == "assistant" else m
        for m in _openai_list(msgs, field)
    ]
    return tuple(out), ()


def openthoughts(row: dict[str, Any]) -> Parsed:
    """OpenThoughts-114k (`system` + user/assistant turns with thought/solution markers),
    OpenThoughts3 (human/gpt with `<think>`), or the 114k `metadata` config (`problem`,
    `deepseek_reasoning`, `deepseek_solution`)."""
    if "conversations" not in row and "problem" in row:
        question = _text(row.get("problem"), "problem")
        if not question.strip():
            raise RowError("missing 'problem'")
        out = [Message("user", question)]
        solution = _text(row.get("deepseek_solution"), "deepseek_solution")
        reasoning = _text(row.get("deepseek_reasoning"), "deepseek_reasoning")
        if solution or reasoning:
            out.append(Message("assistant", solution, reasoning=reasoning or None))
        return tuple(out), ()
    return tuple(_sharegpt_turns(row, reasoned=True)), ()


# --- multi-turn chat ---------------------------------------------------------------------------


def ultrachat(row: dict[str, Any]) -> Parsed:
    """HuggingFaceH4/ultrachat_200k (`messages`) or stingning/ultrachat (`data`: turns by
    position, user first)."""
    if "messages" in row:
        field, msgs = _list(row, "messages")
        return tuple(_openai_list(msgs, field)), ()
    _, data = _list(row, "data")
    out = []
    for i, text in enumerate(data):
        out.append(Message("user" if i % 2 == 0 else "assistant", _text(text, f"data[{i}]")))
    return tuple(out), ()


# --- function calling: glaive --------------------------------------------------------------------

GLAIVE_TAG = re.compile(r"(?P<nl>\n*)[ \t]*(?P<tag>USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
GLAIVE_END = "<|endoftext|>"
GLAIVE_SEP = re.compile(r"<\|endoftext\|>[ \t]*(\n+)")
GLAIVE_TOOLS_MARK = "Use them if required -"
FUNCTIONCALL = "<functioncall>"
NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"]+)"')
QUOTED_ARGS = re.compile(r"""["']arguments["']\s*:\s*'(.*)'\s*\}\s*$""", re.DOTALL)


def _glaive_tools(system: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The system text without its function definitions, and the definitions as tools."""
    text = system.removeprefix("SYSTEM:").strip()
    head, mark, rest = text.partition(GLAIVE_TOOLS_MARK)
    if not mark:
        return text, ()
    decoder = json.JSONDecoder()
    tools: list[dict[str, Any]] = []
    pos = 0
    rest = rest.strip()
    while pos < len(rest):
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if pos >= len(rest):
            break
        try:
            fn, pos = decoder.raw_decode(rest, pos)
        except json.JSONDecodeError as exc:
            raise RowError(
                f"system: function definition {len(tools) + 1} is not JSON: {exc}"
            ) from exc
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowError(f"system: function definition {len(tools) + 1} has no name")
        tools.append({"type": "function", "function": fn})
    return f"{head}{mark}".removesuffix(" -").strip(), unique_tools(tools, "system")


def _call_from_json(text: str, where: str, turn: int) -> ToolCall:
    """A call written as `{"name": …, "arguments": …}`. glaive writes arguments as a
    single-quoted JSON string inside double-quoted JSON; the inner text is kept verbatim."""
    text = text.strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        name = NAME_FIELD.search(text)
        quoted = QUOTED_ARGS.search(text)
        if not name or not quoted:
            raise RowError(f"{where}: function call is not JSON: {text[:80]!r}") from None
        obj = {"name": name.group(1), "arguments": quoted.group(1)}
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise RowError(f"{where}: function call without a name")
    # Llama-style calls name their arguments `parameters`.
    raw = obj["arguments"] if "arguments" in obj else obj.get("parameters", MISSING)
    return ToolCall(f"call_{turn}_0", obj["name"], object_arguments(raw, where))


def _glaive_turns(chat: str) -> list[tuple[str, str]]:
    """The (marker, text) turns of a glaive `chat`. A marker is a turn boundary only where the
    row's own separator puts it: glaive ends each assistant turn with `<|endoftext|>` and
    joins turns with one run of newlines (three in the released set), so that run, read after
    an `<|endoftext|>`, is the row's separator, and a marker after fewer newlines (`\nASSISTANT:`
    quoted inside a user message or a function response) is text of the turn it is in. A row
    with no `<|endoftext|>` splits at every marker that starts a line. The turns must then
    alternate as glaive's do (user, assistant, function response only after a call), else the
    row is refused: a marker inside a turn that cannot be told from a boundary."""
    sep = GLAIVE_SEP.search(chat)
    marks = [
        m
        for m in GLAIVE_TAG.finditer(chat)
        if m.start() == 0
        or m.group("nl")
        and (
            sep is None or (m.group("nl") == sep.group(1) and not chat[: m.start()].endswith("\n"))
        )
    ]
    head = chat[: marks[0].start()] if marks else chat
    if head.strip():
        raise RowError(f"chat: text before the first USER/ASSISTANT marker: {head[:40]!r}")
    return [
        (m.group("tag"), chat[m.end() : marks[k + 1].start() if k + 1 < len(marks) else None])
        for k, m in enumerate(marks)
    ]


def glaive(row: dict[str, Any]) -> Parsed:
    """glaiveai/glaive-function-calling-v2: `system` (function definitions as pretty JSON after
    "Use them if required -") and `chat` with USER/ASSISTANT/FUNCTION RESPONSE markers."""
    system = _text(row.get("system"), "system")
    chat = _text(row.get("chat"), "chat")
    if not chat.strip():
        raise RowError("missing 'chat'")
    system_text, tools = _glaive_tools(system)
    out = [Message("system", system_text)] if system_text else []
    previous: Message | None = None
    for tag, raw in _glaive_turns(chat):
        body = raw.strip()
        turn = len(out)
        if tag == "ASSISTANT":
            body = body.removesuffix(GLAIVE_END).rstrip()
            text, mark, call = body.partition(FUNCTIONCALL)
            calls = (_call_from_json(call, f"chat turn {turn}", turn),) if mark else ()
            m = Message("assistant", text.strip(), tool_calls=calls)
        else:
            if GLAIVE_END in body:
                raise RowError(
                    f"chat turn {turn}: {tag} holds {GLAIVE_END}, which ends assistant turns "
                    "only: a role marker inside the turn split it"
                )
            m = Message("user" if tag == "USER" else "tool", body)
        expected = (
            "assistant"
            if previous is None or previous.role != "assistant"
            else "tool"
            if previous.tool_calls
            else "user"
        )
        if previous is not None and m.role != expected:
            raise RowError(
                f"chat turn {turn}: {tag} after "
                f"{'a function call' if previous.tool_calls else previous.role}: a role marker "
                "inside a turn that cannot be told from a turn boundary"
            )
        out.append(m)
        previous = m
    return tuple(_patch_tool_call_ids(out)), tools


# --- agent trajectories --------------------------------------------------------------------------

SWE_ROLES = {"ai": "assistant", "human": "user", "observation": "tool", "function": "tool"}


def swe_agent(row: dict[str, Any]) -> Parsed:
    """SWE-agent trajectory sets: nebius/SWE-agent-trajectories (`trajectory` of
    {role: system|user|ai, text}), SWE-smith (`messages`, often a JSON string; tool_calls in the
    `tool` split), SWE-rebench-openhands (`trajectory` of OpenAI messages plus `tools`), or a
    SWE-agent `.traj` file's `history` (tool results answer `tool_call_ids`). Calls
    written into the text (xml and ticks splits, SWE-agent 0.x) stay assistant text."""
    field, msgs = _list(row, "trajectory", "messages", "history")
    norm = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RowError(f"{field}[{i}] is not an object")
        if "text" in m and "content" not in m:
            text = m.get("text")
            if m.get("role") == "system" and not text:
                text = m.get("system_prompt")
            m = {**m, "content": text}
        norm.append(m)
    return tuple(_openai_list(norm, field, SWE_ROLES)), _tools(row)


# --- custom mapping ------------------------------------------------------------------------------


def get_path(row: Any, path: str) -> Any:
    """`a.b.0.c` in nested dicts and lists; None where the path does not lead."""
    cur = row
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def custom_adapter(mapping: Mapping[str, Any]) -> Adapter:
    """An adapter from a `[datasets.custom]` mapping: either `messages` (a field path to a list
    of turns, with `role`/`content` keys and a `roles` table) or `prompt`/`response` paths for
    single-turn rows; `system` and `tools` paths are optional."""
    roles = {**SHAREGPT_ROLES, **dict(mapping.get("roles") or {})}
    role_key = mapping.get("role", "role")
    content_key = mapping.get("content", "content")

    def adapt(row: dict[str, Any]) -> Parsed:
        out: list[Message] = []
        if mapping.get("system"):
            system = get_path(row, mapping["system"])
            if isinstance(system, str) and system.strip():
                out.append(Message("system", system))
        if mapping.get("messages"):
            path = mapping["messages"]
            found = get_path(row, path)
            if found is None:
                raise RowError(f"missing '{path}' list")
            msgs = _as_list(found, path)
            turns = []
            for i, m in enumerate(msgs):
                if not isinstance(m, dict):
                    raise RowError(f"{path}[{i}] is not an object")
                turns.append({**m, "role": m.get(role_key), "content": m.get(content_key)})
            out.extend(_openai_list(turns, path, roles))
        else:
            prompt = get_path(row, mapping.get("prompt", "prompt"))
            prompt = _text(prompt, mapping.get("prompt", "prompt"))
            if not prompt.strip():
                raise RowError(f"missing '{mapping.get('prompt', 'prompt')}'")
            out.append(Message("user", prompt))
            if mapping.get("response"):
                answer = _text(get_path(row, mapping["response"]), mapping["response"])
                if answer:
                    out.append(_reasoned("assistant", answer))
        tools: tuple[dict[str, Any], ...] = ()
        if mapping.get("tools"):
            tools = _tools({"tools": get_path(row, mapping["tools"])})
        return tuple(out), tools

    return adapt


# --- registry, detection, entry point ----------------------------------------------------------

ADAPTERS: dict[str, Adapter] = {
    "openai": openai_messages,
    "openai_batch": openai_batch,
    "sharegpt": sharegpt,
    "alpaca": alpaca,
    "glaive": glaive,
    "opencodeinstruct": opencodeinstruct,
    "magicoder": magicoder,
    "mixture_of_thoughts": mixture_of_thoughts,
    "openthoughts": openthoughts,
    "ultrachat": ultrachat,
    "swe_agent": swe_agent,
}


def _is_turns(v: Any, key: str) -> bool:
    if isinstance(v, str):
        return v.lstrip().startswith("[")
    return isinstance(v, list) and (not v or isinstance(v[0], dict) and key in v[0])


def detect_format(row: Mapping[str, Any]) -> list[str]:
    """The formats a row looks like, most specific first: one name is an answer, several are
    an ambiguity to report, none means the fields are unknown."""
    keys = set(row)
    specific = []
    if {"system", "chat"} <= keys:
        specific.append("glaive")
    if {"custom_id", "body"} <= keys:
        specific.append("openai_batch")
    if {"input", "output"} <= keys and "instruction" not in keys:
        specific.append("opencodeinstruct")
    if {"problem", "solution"} <= keys or {"instruction", "response"} <= keys:
        specific.append("magicoder")
    if "trajectory" in keys or keys & {"messages", "history"} and keys & {"traj_id", "instance_id"}:
        specific.append("swe_agent")
    if (
        "messages" in keys
        and {"prompt", "prompt_id"} <= keys
        or ({"id", "data"} <= keys and isinstance(row.get("data"), list))
    ):
        specific.append("ultrachat")
    if "messages" in keys and {"num_tokens", "source"} <= keys:
        specific.append("mixture_of_thoughts")
    convs = row.get("conversations")
    if (
        _is_turns(convs, "from")
        and (keys & {"difficulty", "domain"} or "begin_of_thought" in str(row.get("system", "")))
        or {"problem", "deepseek_solution"} <= keys
    ):
        specific.append("openthoughts")
    if specific:
        return specific
    generic = []
    if _is_turns(row.get("messages"), "role") or _is_turns(convs, "role"):
        generic.append("openai")
    if _is_turns(convs, "from"):
        generic.append("sharegpt")
    if "instruction" in keys:
        generic.append("alpaca")
    return generic  # several: a row that could be read more than one way is an ambiguity


def adapt_row(
    dataset: str, row_index: int, row: dict[str, Any], fmt: str | Adapter
) -> Conversation | BadRow:
    """The row as a Conversation, or a BadRow with the reason; never raises on row content."""
    adapter = ADAPTERS[fmt] if isinstance(fmt, str) else fmt
    try:
        messages, tools = adapter(row)
        if not messages:
            raise RowError("empty conversation")
        if not any(m.role == "user" for m in messages):
            raise RowError("no user turn")
    except RowError as exc:
        return BadRow(dataset, row_index, str(exc))
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        # A shape no adapter foresaw: reported with the row, never fatal.
        return BadRow(dataset, row_index, f"cannot read the row: {type(exc).__name__}: {exc}")
    return Conversation(
        dataset=dataset,
        row_index=row_index,
        messages=messages,
        tools=tools,
        source_id=source_id(row),
    )


ID_FIELDS = ("custom_id", "id", "prompt_id", "instance_id", "traj_id", "uuid", "conversation_id")
"""Where rows keep their own id (a batch file, ShareGPT, UltraChat, SWE sets), first first."""


def source_id(row: Mapping[str, Any]) -> str | None:
    """The row's own id, where it has one (a string or an integer, at most 256 characters)."""
    for key in ID_FIELDS:
        v = row.get(key)
        if isinstance(v, bool) or not isinstance(v, str | int):
            continue
        text = str(v)
        if text and len(text) <= 256:
            return text
    return None
