"""Regeneration modes: which assistant turns of a Conversation become Requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from regen.conversation import Conversation, Message, Request, canonical_json, stable_hash


def target_turns(conv: Conversation, mode: str) -> list[int] | str:
    """Indices of the turns to regenerate, or the reason there are none.

    A turn index is the position of the assistant message the response replaces; an index equal
    to len(messages) means a new turn after a conversation that ends with the user.
    """
    msgs = conv.messages
    if mode == "last_turn":
        last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "assistant"), None)
        if last is None:
            last = len(msgs)
        if not any(m.role == "user" for m in msgs[:last]):
            return "no user turn before the turn to regenerate"
        return [last]
    if mode not in ("each_turn", "sequential"):
        raise ValueError(f"unknown mode {mode!r}")
    first_user = next((i for i, m in enumerate(msgs) if m.role == "user"), len(msgs))
    turns = [i for i in range(first_user + 1, len(msgs)) if msgs[i].role == "assistant"]
    # A conversation that ends on a user turn or a tool result asks for one more answer.
    if msgs and msgs[-1].role in ("user", "tool") and first_user < len(msgs):
        turns.append(len(msgs))
    if not turns:
        return "no assistant turn after a user turn"
    if mode == "sequential" and any(m.role == "tool" for m in msgs[turns[0] :]):
        return (
            "sequential mode cannot reuse the original tool results after a regenerated turn; "
            "use each_turn"
        )
    return turns


def item_id(conversation_id: str, turn_index: int) -> str:
    """Stable item id: the conversation id (dataset + row content) and the turn index."""
    return stable_hash(conversation_id, turn_index)


def build_request(
    conv: Conversation,
    turn_index: int,
    conversation_id: str | None = None,
    regenerated: Mapping[int, Message] | None = None,
) -> Request:
    """The request for one turn: the history before it, the original one, with the turns in
    `regenerated` (sequential mode) put in place of the original answers. Pass the
    conversation id when it is known, to spare hashing the conversation again."""
    cid = conversation_id or conv.id
    history = conv.messages[:turn_index]
    if regenerated:
        history = tuple(regenerated.get(i, m) for i, m in enumerate(history))
    return Request(
        item_id=item_id(cid, turn_index),
        dataset=conv.dataset,
        conversation_id=cid,
        turn_index=turn_index,
        messages=history,
        tools=conv.tools,
    )


def prompt_hash(conv: Conversation, turn_index: int) -> str:
    """What the request for a turn sends (history and tools): equal hashes are sent once."""
    return prompt_hash_of(conv.to_dict(), turn_index)


def prompt_hash_of(data: dict[str, Any], turn_index: int) -> str:
    """prompt_hash from a conversation's stored form (Conversation.to_dict())."""
    history = data["messages"][:turn_index]
    return stable_hash(canonical_json({"messages": history, "tools": data["tools"]}))
