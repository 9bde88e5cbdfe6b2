"""Row formats to Conversation. An adapter raises RowError; adapt_row turns it into a BadRow."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from regen.conversation import ROLES, BadRow, Conversation, Message, ToolCall


class RowError(ValueError):
    """Why one row cannot be used."""


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RowError(f"{where} is {type(value).__name__}, expected a string")
    return value


def _tools(row: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    tools = row.get("tools")
    if tools is None or tools == "":
        return ()
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise RowError(f"'tools' is not valid JSON: {exc}") from exc
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError("'tools' must be a list of objects")
    return tuple(tools)


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    if not isinstance(raw, list) or not all(isinstance(tc, dict) for tc in raw):
        raise RowError(f"{where}.tool_calls must be a list of objects")
    calls = tuple(ToolCall.from_openai(tc) for tc in raw)
    if any(not tc.name for tc in calls):
        raise RowError(f"{where}.tool_calls has a call without a function name")
    return calls


def openai_messages(row: dict[str, Any]) -> tuple[tuple[Message, ...], tuple[dict[str, Any], ...]]:
    """`{"messages": [{"role", "content", "tool_calls"?, ...}], "tools"?}`."""
    msgs = row.get("messages", row.get("conversations"))
    if not isinstance(msgs, list):
        raise RowError("missing 'messages' list")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RowError(f"{where} is not an object")
        role = m.get("role")
        if role not in ROLES:
            raise RowError(f"{where}.role is {role!r} (allowed: {', '.join(ROLES)})")
        reasoning = m.get("reasoning", m.get("reasoning_content"))
        out.append(
            Message(
                role=role,
                content=_text(m.get("content"), f"{where}.content"),
                reasoning=_text(reasoning, f"{where}.reasoning") if reasoning else None,
                tool_calls=_tool_calls(m.get("tool_calls"), where),
                tool_call_id=m.get("tool_call_id") if role == "tool" else None,
                name=m.get("name") if isinstance(m.get("name"), str) else None,
            )
        )
    return tuple(out), _tools(row)


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function": "tool",
}


def sharegpt(row: dict[str, Any]) -> tuple[tuple[Message, ...], tuple[dict[str, Any], ...]]:
    """`{"conversations": [{"from": "human"|"gpt"|..., "value"}], "system"?}`."""
    turns = row.get("conversations", row.get("items"))
    if not isinstance(turns, list):
        raise RowError("missing 'conversations' list")
    out = []
    system = row.get("system")
    if isinstance(system, str) and system.strip():
        out.append(Message("system", system))
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise RowError(f"{where} is not an object")
        speaker = t.get("from")
        role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
        if role is None:
            raise RowError(f"{where}.from is {speaker!r}, not a known speaker")
        out.append(Message(role, _text(t.get("value"), f"{where}.value")))
    return tuple(out), _tools(row)


def alpaca(row: dict[str, Any]) -> tuple[tuple[Message, ...], tuple[dict[str, Any], ...]]:
    """`{"instruction", "input"?, "output"?, "system"?}`."""
    instruction = _text(row.get("instruction"), "instruction")
    if not instruction.strip():
        raise RowError("missing 'instruction'")
    extra = _text(row.get("input"), "input")
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    out = []
    system = _text(row.get("system"), "system")
    if system.strip():
        out.append(Message("system", system))
    out.append(Message("user", prompt))
    output = _text(row.get("output"), "output")
    if output:
        out.append(Message("assistant", output))
    return tuple(out), ()


Adapter = Callable[[dict[str, Any]], tuple[tuple[Message, ...], tuple[dict[str, Any], ...]]]
ADAPTERS: dict[str, Adapter] = {"openai": openai_messages, "sharegpt": sharegpt, "alpaca": alpaca}


def adapt_row(dataset: str, row_index: int, row: dict[str, Any], fmt: str) -> Conversation | BadRow:
    """The row as a Conversation, or a BadRow with the reason; never raises on row content."""
    try:
        messages, tools = ADAPTERS[fmt](row)
        if not messages:
            raise RowError("empty conversation")
        if not any(m.role == "user" for m in messages):
            raise RowError("no user turn")
    except RowError as exc:
        return BadRow(dataset, row_index, str(exc))
    return Conversation(dataset=dataset, row_index=row_index, messages=messages, tools=tools)
