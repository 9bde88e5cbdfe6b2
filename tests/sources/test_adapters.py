from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.conversation import BadRow, Conversation
from regen.sources.adapters import ADAPTERS, adapt_row, custom_adapter, detect_format


def conv(row: dict[str, Any], fmt: str) -> Conversation:
    out = adapt_row("ds", 0, row, fmt)
    assert isinstance(out, Conversation), out
    return out


def bad(row: dict[str, Any], fmt: str) -> str:
    out = adapt_row("ds", 7, row, fmt)
    assert isinstance(out, BadRow), out
    assert out.row_index == 7
    return out.reason


def test_openai_messages_keep_tool_calls_tools_and_reasoning() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    c = conv(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "think",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"x": 1}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            "tools": json.dumps(tools),
        },
        "openai",
    )
    assert [m.role for m in c.messages] == ["user", "assistant", "tool"]
    call = c.messages[1].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments)) == ("c1", "f", {"x": 1})
    assert c.messages[1].reasoning == "think"
    assert c.messages[2].tool_call_id == "c1"
    assert c.tools == tuple(tools)


def test_sharegpt_maps_speakers_and_system_field() -> None:
    c = conv(
        {
            "system": "be nice",
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "a"},
                {"from": "user", "value": "q2"},
                {"from": "chatgpt", "value": "a2"},
            ],
        },
        "sharegpt",
    )
    assert [(m.role, m.content) for m in c.messages] == [
        ("system", "be nice"),
        ("user", "q"),
        ("assistant", "a"),
        ("user", "q2"),
        ("assistant", "a2"),
    ]


def test_alpaca_joins_instruction_and_input() -> None:
    c = conv({"instruction": "Do X.", "input": "data", "output": "done"}, "alpaca")
    assert [(m.role, m.content) for m in c.messages] == [
        ("user", "Do X.\n\ndata"),
        ("assistant", "done"),
    ]
    c = conv({"instruction": "Do X.", "input": "", "output": ""}, "alpaca")
    assert [(m.role, m.content) for m in c.messages] == [("user", "Do X.")]


def test_bad_rows_say_why() -> None:
    assert "missing 'messages'" in bad({"msgs": []}, "openai")
    assert "messages[0].role is 'robot'" in bad({"messages": [{"role": "robot"}]}, "openai")
    assert "no user turn" in bad({"messages": [{"role": "assistant", "content": "x"}]}, "openai")
    assert "empty conversation" in bad({"messages": []}, "openai")
    assert "content is int" in bad({"messages": [{"role": "user", "content": 3}]}, "openai")
    assert "not a known speaker" in bad({"conversations": [{"from": "alien"}]}, "sharegpt")
    assert "missing 'instruction'" in bad({"output": "x"}, "alpaca")
    assert "'tools' is not valid JSON" in bad(
        {"messages": [{"role": "user", "content": "q"}], "tools": "[oops"}, "openai"
    )


def test_ids_are_stable_and_depend_on_dataset_and_content() -> None:
    row = {"messages": [{"role": "user", "content": "q"}]}
    a, b = conv(row, "openai"), conv(dict(row), "openai")
    assert a.id == b.id
    other = adapt_row("other", 0, row, "openai")
    assert isinstance(other, Conversation) and other.id != a.id
    changed = conv({"messages": [{"role": "user", "content": "q!"}]}, "openai")
    assert changed.id != a.id


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "messages",
        "conversations",
        "role",
        "content",
        "from",
        "value",
        "tools",
        "instruction",
        "input",
        "output",
        "system",
        "tool_calls",
        "function",
        "name",
        "arguments",
        "chat",
        "problem",
        "solution",
        "response",
        "trajectory",
        "data",
        "text",
        "prompt",
        "prompt_id",
        "num_tokens",
        "source",
        "difficulty",
        "traj_id",
        "instance_id",
        "deepseek_solution",
        "deepseek_reasoning",
        "tool_call_id",
        "system_prompt",
    ]
)
rows = st.dictionaries(keys | st.text(max_size=5), json_values, max_size=6)
message_like = st.dictionaries(
    keys,
    json_values | st.sampled_from(["user", "assistant", "tool", "system", "human", "gpt"]),
    max_size=5,
)
marked_text = st.lists(
    st.sampled_from(
        [
            "USER: ",
            "ASSISTANT: ",
            "FUNCTION RESPONSE: ",
            "\n\n\n",
            "<functioncall> ",
            '{"name": "f", "arguments": \'{"a": 1}\'}',
            '{"name": "f"',
            " <|endoftext|>",
            "<think>",
            "</think>",
            "<|begin_of_thought|>",
            "<|end_of_thought|>",
            "<|begin_of_solution|>",
            "Use them if required -\n",
            '{"name": "g", "parameters": {}}',
            "SYSTEM: ",
            "text",
        ]
    ),
    max_size=12,
).map("".join)
structured = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(message_like, max_size=4) | marked_text,
        "conversations": st.lists(message_like, max_size=4),
        "trajectory": st.lists(message_like, max_size=4),
        "tools": json_values,
        "system": marked_text,
        "chat": marked_text,
        "data": st.lists(marked_text | json_values, max_size=4),
        "problem": marked_text,
        "solution": marked_text,
        "input": marked_text,
        "output": marked_text,
    },
)


@settings(max_examples=300, deadline=None)
@given(row=rows | structured, fmt=st.sampled_from(sorted(ADAPTERS)))
def test_adapters_never_raise_on_arbitrary_rows(row: dict[str, Any], fmt: str) -> None:
    out = adapt_row("ds", 3, row, fmt)
    assert isinstance(out, Conversation | BadRow)
    if isinstance(out, Conversation):
        assert any(m.role == "user" for m in out.messages)
        json.dumps(out.to_dict())  # always storable
    else:
        # Every reason is one the adapter gave, not the last-resort catch of a shape it missed.
        assert not out.reason.startswith("cannot read the row"), out.reason
    detect_format(row)


@settings(max_examples=200, deadline=None)
@given(row=rows | structured, messages=st.booleans())
def test_custom_mappings_never_raise(row: dict[str, Any], messages: bool) -> None:
    mapping = (
        {"messages": "messages", "role": "from", "content": "value", "system": "system"}
        if messages
        else {"prompt": "problem", "response": "solution", "tools": "tools"}
    )
    out = adapt_row("ds", 3, row, custom_adapter(mapping))
    assert isinstance(out, Conversation | BadRow)
    if isinstance(out, BadRow):
        assert not out.reason.startswith("cannot read the row"), out.reason
