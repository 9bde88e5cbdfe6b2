from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import regen
from regen.conversation import Conversation, Message, ToolCall, stable_hash


def test_public_names_are_pinned() -> None:
    assert sorted(regen.__all__) == [
        "ConfigError",
        "Conversation",
        "EndpointError",
        "Message",
        "RegenError",
        "Request",
        "Result",
        "SourceError",
        "StateError",
        "ToolCall",
        "Usage",
        "__version__",
    ]


def test_stable_hash_separates_parts() -> None:
    assert stable_hash("ab", "c") != stable_hash("a", "bc")
    assert stable_hash("a", 1) == stable_hash("a", "1")


text = st.text(max_size=20)
calls = st.builds(ToolCall, id=text, name=text.filter(bool), arguments=text)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=text,
    reasoning=st.none() | text.filter(bool),
    tool_calls=st.lists(calls, max_size=2).map(tuple),
    tool_call_id=st.none() | text,
    name=st.none() | text,
)


@given(msgs=st.lists(messages, min_size=1, max_size=5))
def test_conversations_round_trip_through_their_stored_form(msgs: list[Message]) -> None:
    conv = Conversation("ds", 4, tuple(msgs))
    back = Conversation.from_dict("ds", 4, conv.to_dict())
    assert back == conv and back.id == conv.id
