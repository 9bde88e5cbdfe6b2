"""Regeneration modes: which assistant turns of a Conversation become Requests."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from regen.conversation import Conversation, Message, Request, canonical_json, stable_hash


def answerable(msgs: tuple[Message, ...], turn: int) -> bool:
    """Whether a prompt may end before message `turn`: it must end on a user turn or a tool
    result (a prompt that ends on an assistant turn asks the model to continue text it did
    not write)."""
    return turn > 0 and msgs[turn - 1].role in ("user", "tool")


def target_turns(conv: Conversation, mode: str) -> list[int] | str:
    """Indices of the turns to regenerate, or the reason there are none.

    A turn index is the position of the assistant message the response replaces; an index equal
    to len(messages) means a new turn after a conversation that ends with a user turn or a
    tool result. Every mode answers such a trailing turn (`last_turn` answers it instead of
    the assistant turn before it). No prompt ends on an assistant turn: an assistant turn
    right after another (a continuation) is context, never a turn to regenerate
    (`continuations` counts them for the row's note).
    """
    msgs = conv.messages
    if not msgs:
        return "empty conversation"
    trailing = msgs[-1].role in ("user", "tool")
    if mode == "last_turn":
        last = next(
            (i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "assistant"), len(msgs)
        )
        if trailing:
            last = len(msgs)
        if not any(m.role == "user" for m in msgs[:last]):
            return "no user turn before the turn to regenerate"
        if not answerable(msgs, last):
            return (
                f"the last assistant turn (message {last}) follows another assistant turn: its "
                "prompt would end on an assistant turn; use mode each_turn"
            )
        return [last]
    if mode not in ("each_turn", "sequential"):
        raise ValueError(f"unknown mode {mode!r}")
    first_user = next((i for i, m in enumerate(msgs) if m.role == "user"), len(msgs))
    turns = [
        i
        for i in range(first_user + 1, len(msgs))
        if msgs[i].role == "assistant" and answerable(msgs, i)
    ]
    if trailing and first_user < len(msgs):
        turns.append(len(msgs))
    if not turns:
        return "no assistant turn after a user turn"
    if mode == "sequential" and any(m.role == "tool" for m in msgs[turns[0] :]):
        return (
            "sequential mode cannot reuse the original tool results after a regenerated turn; "
            "use each_turn"
        )
    return turns


def continuations(conv: Conversation) -> list[int]:
    """Assistant turns right after another assistant turn (kept as context, not regenerated)."""
    msgs = conv.messages
    return [
        i
        for i in range(1, len(msgs))
        if msgs[i].role == "assistant" and msgs[i - 1].role == "assistant"
    ]


VISIBLE_REASONING = re.compile(r"<\|begin_of_thought\|>|<think>|</think>")
"""Markers a system prompt names when it asks the model to write its reasoning as text."""


def row_notes(conv: Conversation, reasons: bool = True) -> list[str]:
    """What a row that is used still does not say plainly: calls to functions it does not
    declare, assistant turns kept as context only (after another assistant turn), a system
    prompt that asks for visible reasoning markers (a reasoning model then writes its
    reasoning twice: set system = "drop" or "replace"; not noted when the job turns the
    target's reasoning off: `reasons` False)."""
    notes = []
    declared = {str((t.get("function") or {}).get("name")) for t in conv.tools}
    undeclared = sorted(
        {tc.name for m in conv.messages for tc in m.tool_calls if tc.name not in declared}
    )
    if undeclared:
        what = "declares no tools for" if not conv.tools else "does not declare"
        notes.append(f"calls functions it {what} ({', '.join(undeclared[:3])})")
    kept = continuations(conv)
    if kept:
        notes.append(
            f"assistant turns right after another kept as context, not regenerated ({len(kept)})"
        )
    system = next((m.content for m in conv.messages if m.role == "system"), "")
    marker = VISIBLE_REASONING.search(system) if reasons else None
    if marker:
        notes.append(
            f"system prompt asks for visible reasoning ({marker.group()}): a target that "
            'reasons natively writes it twice; set system = "drop" or "replace"'
        )
    return notes


def item_id(conversation_id: str, turn_index: int, sample: int = 0) -> str:
    """Stable item id: the conversation id (dataset + row content), the turn index and, past
    the first, the sample (the first sample keeps the id an item had before samples)."""
    if sample:
        return stable_hash(conversation_id, turn_index, f"sample {sample}")
    return stable_hash(conversation_id, turn_index)


def sample_prompt_hash(prompt_hash: str, sample: int) -> str:
    """A sample's prompt key: identical prompts are sent once per sample index."""
    return prompt_hash if not sample else stable_hash(prompt_hash, f"sample {sample}")


def build_request(
    conv: Conversation,
    turn_index: int,
    conversation_id: str | None = None,
    regenerated: Mapping[int, Message] | None = None,
    sample: int = 0,
) -> Request:
    """The request for one turn: the history before it, the original one, with the turns in
    `regenerated` (sequential mode) put in place of the original answers. Pass the
    conversation id when it is known, to spare hashing the conversation again."""
    cid = conversation_id or conv.id
    history = conv.messages[:turn_index]
    if regenerated:
        history = tuple(regenerated.get(i, m) for i, m in enumerate(history))
    return Request(
        item_id=item_id(cid, turn_index, sample),
        dataset=conv.dataset,
        conversation_id=cid,
        turn_index=turn_index,
        messages=history,
        tools=conv.tools,
        sample=sample,
    )


def prompt_hash(conv: Conversation, turn_index: int) -> str:
    """What the request for a turn sends (history and tools): equal hashes are sent once."""
    return prompt_hash_of(conv.to_dict(), turn_index)


def prompt_hash_of(data: dict[str, Any], turn_index: int) -> str:
    """prompt_hash from a conversation's stored form (Conversation.to_dict())."""
    history = data["messages"][:turn_index]
    return stable_hash(canonical_json({"messages": history, "tools": data["tools"]}))
