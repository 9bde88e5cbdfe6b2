"""Real rows of public datasets (fixtures/real, sources in fixtures/real/SOURCES.md) are read
into the request they should become, or refused with their reason; no prompt ends on an
assistant turn; calls carry JSON objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.conversation import BadRow, Conversation, Message, ToolCall
from regen.sources import Source
from regen.sources.adapters import adapt_row
from regen.sources.modes import build_request, row_notes, target_turns
from tests.conftest import fuzz_examples, roles

REAL = Path(__file__).parent / "fixtures" / "real"


def read(name: str, fmt: str = "auto") -> tuple[list[Conversation], list[BadRow], str]:
    src = Source("ds", REAL / name, fmt)
    out = list(src)
    convs = [c for c in out if isinstance(c, Conversation)]
    return convs, [b for b in out if isinstance(b, BadRow)], src.format


def test_glaive_row_25475_as_the_file_holds_it() -> None:
    (c, c2), bad, fmt = read("glaive.json")
    assert not bad and fmt == "glaive"
    assert roles(c) == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    (tool,) = c.tools
    assert tool["function"]["name"] == "detect_language"
    (call,) = c.messages[4].tool_calls
    # The single-quoted arguments string is kept verbatim (it reads as a JSON object).
    assert (call.name, call.arguments) == ("detect_language", '{"text": "Je suis un étudiant"}')
    assert (
        c.messages[5].tool_call_id == call.id and c.messages[5].content == '{"language": "French"}'
    )
    assert c.messages[6].content == "The text you provided is in French."
    # Row 107105 joins its turns with two newlines: the row's own separator, read after
    # <|endoftext|>, decides; the newline inside the first question stays in it.
    assert roles(c2) == ["system", "user", "assistant", "user", "assistant"]
    assert c2.messages[1].content == "Assign this occupation to the appropriate category\nNurse"


SHORTENED = json.loads((REAL / "glaive_shortened.json").read_text())


@pytest.mark.parametrize("case", SHORTENED, ids=[str(c["row"]) for c in SHORTENED])
def test_glaive_real_row_shapes_are_read_right_or_refused(case: dict[str, Any]) -> None:
    got = adapt_row("ds", 0, {"system": case["system"], "chat": case["chat"]}, "glaive")
    if "refused" in case:
        assert isinstance(got, BadRow), got
        assert case["refused"] in got.reason
        return
    assert isinstance(got, Conversation), got
    for m in got.messages:
        for tc in m.tool_calls:
            assert isinstance(json.loads(tc.arguments), dict)
    calls = [tc for m in got.messages for tc in m.tool_calls]
    if case["accepted"] == "one tool":
        assert len(got.tools) == 1  # declared twice in the same words: sent once
    elif case["accepted"] == "parameters are the arguments":
        assert [(tc.name, tc.arguments) for tc in calls] == [("get_random_quote", "{}")]
    elif case["accepted"] == "note: undeclared":
        assert row_notes(got) == ["calls functions it does not declare (create_to_do_list)"]
    else:  # text before the call stays the turn's content, beside the call
        (turn,) = [m for m in got.messages if m.tool_calls]
        assert turn.content.startswith("Of course") and turn.tool_calls[0].name == "search_products"


def test_llama_factory_glaive_toolcall_rows() -> None:
    convs, bad, _ = read("glaive_toolcall_en.json", "sharegpt")
    assert not bad and len(convs) == 4
    three_calls = convs[1]
    assert len(three_calls.tools) == 2
    calls = [tc for m in three_calls.messages for tc in m.tool_calls]
    assert len(calls) == 3 and all(isinstance(json.loads(tc.arguments), dict) for tc in calls)
    answered = [m.tool_call_id for m in three_calls.messages if m.role == "tool"]
    assert answered == [tc.id for tc in calls]
    assert convs[2].tools == ()  # "tools": "[]"


def test_sharegpt_ultrachat_and_batch_rows_keep_their_own_ids() -> None:
    convs, bad, _ = read("sharegpt.json", "sharegpt")
    assert not bad and [c.source_id for c in convs] == ["QWJhYvA_0", "i6IyJda_0"]
    assert len(convs[0].messages) == 12
    (uc,), bad, fmt = read("ultrachat_200k.jsonl")
    assert fmt == "ultrachat" and uc.source_id and uc.source_id.startswith("f0e37e9f")
    batch, bad, fmt = read("batch_input.jsonl")
    assert fmt == "openai_batch" and not bad
    assert [c.source_id for c in batch] == ["request-1", "request-2"]
    assert [roles(c) for c in batch] == [["system", "user"]] * 2
    # The batch line asks for an answer after its user turn.
    assert target_turns(batch[0], "last_turn") == [2]


def test_swe_agent_trajectories() -> None:
    (xml,), bad, fmt = read("swe_smith_xml.jsonl")
    assert fmt == "swe_agent" and not bad and xml.source_id.startswith("pandas-dev__pandas")
    # Tool outputs come back as user turns (the xml split); the final submit is regenerated.
    assert xml.messages[-1].role == "assistant" and xml.messages[-2].role == "user"
    assert target_turns(xml, "last_turn") == [len(xml.messages) - 1]
    (traj,), bad, fmt = read("swe_agent_traj.jsonl")
    assert fmt == "swe_agent" and not bad
    results = [m for m in traj.messages if m.role == "tool"]
    calls = [tc.id for m in traj.messages for tc in m.tool_calls]
    assert results and all(m.tool_call_id in calls for m in results)  # from tool_call_ids
    assert row_notes(traj) == [
        "calls functions it declares no tools for (bash, str_replace_editor, submit)"
    ]


def test_a_trailing_user_or_tool_turn_is_answered_in_last_turn_mode() -> None:
    msgs = (
        Message("user", "q1"),
        Message("assistant", "a1"),
        Message("user", "q2"),
    )
    conv = Conversation("ds", 0, msgs)
    assert target_turns(conv, "last_turn") == [3]
    req = build_request(conv, 3)
    assert [m.role for m in req.messages] == ["user", "assistant", "user"]


ROLE = st.sampled_from(["system", "user", "assistant", "tool"])


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.lists(ROLE, min_size=1, max_size=12), st.sampled_from(["last_turn", "each_turn"]))
def test_no_prompt_ends_on_an_assistant_turn(seq: list[str], mode: str) -> None:
    msgs = tuple(
        Message(r, f"m{i}", tool_calls=(ToolCall(f"c{i}", "f", "{}"),) if r == "assistant" else ())
        for i, r in enumerate(seq)
    )
    turns = target_turns(Conversation("ds", 0, msgs), mode)
    if isinstance(turns, str):
        return
    for t in turns:
        assert t > 0 and msgs[t - 1].role in ("user", "tool")
        assert t == len(msgs) or msgs[t].role == "assistant"


def test_a_system_prompt_asking_for_visible_reasoning_is_noted() -> None:
    (conv,) = [
        c
        for c in Source("ds", REAL.parent / "b5_openthoughts_114k.jsonl", "openthoughts")
        if isinstance(c, Conversation)
    ]
    (note,) = row_notes(conv)
    assert "visible reasoning (<|begin_of_thought|>)" in note
    assert 'system = "drop" or "replace"' in note
