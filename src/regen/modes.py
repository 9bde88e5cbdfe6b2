"""Regeneration modes: which assistant turns of a Conversation become Requests."""

from __future__ import annotations

from typing import Any

from regen.conversation import Conversation, Request, canonical_json, stable_hash


def target_turns(conv: Conversation, mode: str) -> list[int] | str:
    """Indices of the turns to regenerate, or the reason there are none.

    A turn index is the position of the assistant message the response replaces; an index equal
    to len(messages) means a new turn after a conversation that ends with the user.
    """
    if mode != "last_turn":
        raise ValueError(f"unknown mode {mode!r}")
    msgs = conv.messages
    last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "assistant"), None)
    if last is None:
        last = len(msgs)
    if not any(m.role == "user" for m in msgs[:last]):
        return "no user turn before the turn to regenerate"
    return [last]


def item_id(conversation_id: str, turn_index: int) -> str:
    """Stable item id: the conversation id (dataset + row content) and the turn index."""
    return stable_hash(conversation_id, turn_index)


def build_request(
    conv: Conversation, turn_index: int, conversation_id: str | None = None
) -> Request:
    """The request for one turn: the original history before it. Pass the conversation id
    when it is known, to spare hashing the conversation again."""
    cid = conversation_id or conv.id
    return Request(
        item_id=item_id(cid, turn_index),
        dataset=conv.dataset,
        conversation_id=cid,
        turn_index=turn_index,
        messages=conv.messages[:turn_index],
        tools=conv.tools,
    )


def prompt_hash(conv: Conversation, turn_index: int) -> str:
    """What the request for a turn sends (history and tools): equal hashes are sent once."""
    return prompt_hash_of(conv.to_dict(), turn_index)


def prompt_hash_of(data: dict[str, Any], turn_index: int) -> str:
    """prompt_hash from a conversation's stored form (Conversation.to_dict())."""
    history = data["messages"][:turn_index]
    return stable_hash(canonical_json({"messages": history, "tools": data["tools"]}))
