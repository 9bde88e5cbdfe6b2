"""The eight dataset families: fixture rows with the real field names and quirks parse into the
expected conversations, by their own format and by `auto`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.conversation import BadRow, Conversation
from regen.errors import SourceError
from regen.sources import Source, detect_format
from tests.conftest import roles

FIXTURES = Path(__file__).parent / "fixtures"


def read(name: str, fmt: str = "auto", **kw: object) -> tuple[list[Conversation], list[BadRow]]:
    src = Source("ds", FIXTURES / name, fmt, **kw)  # type: ignore[arg-type]
    out = list(src)
    return [c for c in out if isinstance(c, Conversation)], [
        b for b in out if isinstance(b, BadRow)
    ]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("b1_glaive.json", "glaive"),
        ("b2_opencodeinstruct.jsonl", "opencodeinstruct"),
        ("b3_magicoder_oss.jsonl", "magicoder"),
        ("b3_magicoder_evol.jsonl", "magicoder"),
        ("b4_mixture_of_thoughts.jsonl", "mixture_of_thoughts"),
        ("b5_openthoughts_114k.jsonl", "openthoughts"),
        ("b5_openthoughts3.jsonl", "openthoughts"),
        ("b6_ultrachat_200k.jsonl", "ultrachat"),
        ("b6_ultrachat_stingning.jsonl", "ultrachat"),
        ("b7_sharegpt.json", "sharegpt"),
        ("b8_swe_nebius.jsonl", "swe_agent"),
        ("b8_swe_smith_tool.jsonl", "swe_agent"),
        ("b8_swe_smith_xml.jsonl", "swe_agent"),
        ("b8_openhands.jsonl", "swe_agent"),
    ],
)
def test_auto_detects_each_family(name: str, fmt: str) -> None:
    src = Source("ds", FIXTURES / name, "auto")
    list(src)
    assert src.format == fmt
    assert read(name, "auto") == read(name, fmt)


def test_glaive_functions_become_tools_and_calls_become_tool_calls() -> None:
    convs, bad = read("b1_glaive.json", "glaive")
    first = convs[0]
    assert roles(first) == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert first.messages[0].content == (
        "You are a helpful assistant with access to the following functions. Use them if required"
    )
    assert [t["function"]["name"] for t in first.tools] == ["convert_currency", "get_weather"]
    assert first.tools[0]["type"] == "function"
    call = first.messages[2].tool_calls[0]
    # The single-quoted arguments string is kept verbatim, and it is valid JSON.
    assert call.name == "convert_currency"
    assert call.arguments == '{"amount": 120, "from": "EUR", "to": "USD"}'
    assert first.messages[2].content == ""
    assert first.messages[3].tool_call_id == call.id
    assert first.messages[3].content == '{"converted": 130.2, "currency": "USD"}'
    assert first.messages[4].content == "120 euros is about 130.20 US dollars."
    assert "<|endoftext|>" not in "".join(m.content for m in first.messages)
    # No tools: a plain system prompt and no tools list.
    assert convs[1].tools == ()
    assert convs[1].messages[0].content.startswith("You are a helpful assistant, with no access")
    # Row 2's arguments are cut off: reported, not fatal; row 3 ends on a function response.
    assert [(b.row_index, "not valid JSON" in b.reason) for b in bad] == [(2, True)]
    assert roles(convs[2])[-1] == "tool"


def test_opencodeinstruct_and_magicoder_are_single_turn() -> None:
    convs, bad = read("b2_opencodeinstruct.jsonl")
    assert roles(convs[0]) == ["user", "assistant"]
    assert convs[0].messages[0].content.startswith("Write a function `second_largest")
    assert [(b.row_index, b.reason) for b in bad] == [(2, "missing 'input'")]
    oss, _ = read("b3_magicoder_oss.jsonl")
    assert oss[0].messages[0].content.startswith("You are given n integers")
    assert "cin" not in oss[0].messages[0].content  # the seed is not the prompt
    evol, _ = read("b3_magicoder_evol.jsonl")
    assert evol[0].messages[1].content.startswith("```python")


def test_reasoning_sets_split_the_inline_reasoning_from_the_answer() -> None:
    mot, _ = read("b4_mixture_of_thoughts.jsonl")
    answer = mot[0].messages[1]
    assert answer.reasoning == "The sum of the first n odd numbers is n^2, so 2500."
    assert answer.content == "The sum is \\boxed{2500}."
    ot, _ = read("b5_openthoughts_114k.jsonl")
    assert roles(ot[0]) == ["system", "user", "assistant"]
    assert ot[0].messages[2].reasoning == "7 times 8 is 56."
    assert ot[0].messages[2].content == "\\boxed{56}"
    ot3, _ = read("b5_openthoughts3.jsonl")
    assert roles(ot3[0]) == ["user", "assistant"]
    assert ot3[0].messages[1].reasoning == " x^2 - 2x = 0 so x(x-2)=0. "
    assert ot3[0].messages[1].content == "x = 0 or x = 2."


def test_ultrachat_both_layouts() -> None:
    h4, _ = read("b6_ultrachat_200k.jsonl")
    assert roles(h4[0]) == ["user", "assistant", "user", "assistant"]
    orig, _ = read("b6_ultrachat_stingning.jsonl")
    assert roles(orig[0]) == ["user", "assistant", "user", "assistant"]
    assert orig[0].messages[2].content == "And spring tides?"
    assert roles(orig[1]) == ["user"]


def test_sharegpt_odd_speakers_and_pieces() -> None:
    convs, bad = read("b7_sharegpt.json")
    # A split piece starts with the end of an answer: dropped by default, or kept as history.
    assert roles(convs[1]) == ["user", "assistant"]
    kept, _ = read("b7_sharegpt.json", leading_assistant="keep")
    assert roles(kept[1]) == ["assistant", "user", "assistant"]
    assert roles(convs[2]) == ["system", "user", "assistant"]  # bing is an assistant
    assert [(b.row_index, b.reason) for b in bad] == [
        (3, "conversations[0].from is 'narrator', not a known speaker")
    ]


def test_swe_trajectories() -> None:
    nebius, _ = read("b8_swe_nebius.jsonl")
    c = nebius[0]
    assert roles(c) == ["system", "user", "assistant", "user", "assistant"]
    assert c.messages[0].content.startswith("SETTING: You are an autonomous programmer")
    assert c.messages[2].content.startswith("DISCUSSION") and not c.messages[2].tool_calls
    smith, _ = read("b8_swe_smith_tool.jsonl")
    s = smith[0]
    assert roles(s) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert s.messages[1].content.startswith("<pr_description>")  # content parts joined
    # The first tool result lacks its tool_call_id: patched from the call it answers.
    assert s.messages[3].tool_call_id == "toolu_01"
    assert s.messages[5].tool_call_id == "toolu_02"
    hands, _ = read("b8_openhands.jsonl")
    assert [t["function"]["name"] for t in hands[0].tools] == ["execute_bash"]
    assert hands[0].messages[2].tool_calls[0].name == "execute_bash"


def test_ambiguous_and_unknown_rows_stop_auto_with_one_clear_line(tmp_path: Path) -> None:
    p = tmp_path / "amb.jsonl"
    p.write_text(
        json.dumps({"system": "s", "chat": "USER: hi", "input": "a", "output": "b"}) + "\n"
    )
    with pytest.raises(SourceError, match="fit formats glaive and opencodeinstruct"):
        list(Source("ds", p, "auto"))
    p.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(
        SourceError, match=r"row 0: cannot tell the format from the fields \(answer"
    ):
        list(Source("ds", p, "auto"))
    assert detect_format({"messages": [{"role": "user", "content": "x"}]}) == ["openai"]


def test_custom_mapping_for_turn_lists_and_single_turn_rows(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    row = {
        "meta": {"sys": "be brief"},
        "dialog": [{"speaker": "Q", "text": "hi"}, {"speaker": "A", "text": "hello"}],
    }
    p.write_text(json.dumps(row) + "\n" + json.dumps({"dialog": [{"speaker": "X"}]}) + "\n")
    mapping = {
        "messages": "dialog",
        "role": "speaker",
        "content": "text",
        "roles": {"Q": "user", "A": "assistant"},
        "system": "meta.sys",
    }
    out = list(Source("ds", p, "custom", custom=mapping))
    assert isinstance(out[0], Conversation)
    assert [(m.role, m.content) for m in out[0].messages] == [
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "hello"),
    ]
    assert isinstance(out[1], BadRow) and "dialog[0].role is 'X'" in out[1].reason
    p.write_text(json.dumps({"q": {"text": "2+2?"}, "a": "<think>add</think>4"}) + "\n")
    (c,) = list(Source("ds", p, "custom", custom={"prompt": "q.text", "response": "a"}))
    assert isinstance(c, Conversation)
    assert (c.messages[1].reasoning, c.messages[1].content) == ("add", "4")
