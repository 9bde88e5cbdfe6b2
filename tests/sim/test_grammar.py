"""The simulator's completions are token ids in the family grammar, parsed back honestly."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.sim.generate import generate
from regen.sim.grammar import Call, grammar, sim_tokenizer
from regen.sim.words import WORDS

WEATHER = Call("get_weather", '{"city": "Paris"}')


def decode(ids: list[int]) -> str:
    return sim_tokenizer().decode(ids, skip_special_tokens=False)


def test_kimi_k25_completion_layout() -> None:
    g = grammar("kimi-k2.5")
    ids = g.completion_ids("the model checks", "so we compute", [WEATHER], thinking=True)
    assert decode(ids) == (
        "the model checks</think>so we compute<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    assert decode(g.completion_ids("", "hi", [], thinking=False)) == "hi<|im_end|>"


def test_qwen3_completion_layout() -> None:
    g = grammar("qwen3")
    ids = g.completion_ids("think", "answer", [WEATHER], thinking=True)
    assert decode(ids) == (
        "<think>\nthink\n</think>\n\nanswer\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )


def test_kimi_prompt_prefills_think_and_drops_finished_reasoning() -> None:
    g = grammar("kimi-k2.5")
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning": "old thoughts"},
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "loop thoughts",
            "tool_calls": [
                {
                    "id": "functions.f:0",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
    ]
    text = g.render_prompt(msgs, [], thinking=True)
    assert text.startswith("<|im_system|>system<|im_middle|>You are Kimi")
    assert "old thoughts" not in text and "<think></think>a1" in text
    assert "<think>loop thoughts</think>" in text
    assert "## Return of functions.f:0\n42<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    assert g.render_prompt(msgs[:1], [], thinking=False).endswith("<think></think>")


def test_every_sim_word_is_one_token() -> None:
    tok = sim_tokenizer()
    for w in WORDS:
        assert len(tok.encode(w).ids) == 1 and len(tok.encode(" " + w).ids) == 1


words = st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join)
names = st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True)
args = st.dictionaries(
    st.sampled_from(WORDS), st.integers(0, 999) | st.sampled_from(WORDS), max_size=3
).map(json.dumps)
calls = st.lists(st.builds(Call, names, args), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(["kimi-k2.5", "qwen3"]),
    reasoning=words,
    content=words,
    calls=calls,
    thinking=st.booleans(),
)
def test_parse_gives_back_what_was_generated(
    family: str, reasoning: str, content: str, calls: list[Call], thinking: bool
) -> None:
    g = grammar(family)
    ids = g.completion_ids(reasoning, content, calls, thinking)
    parsed = g.parse(ids, thinking)
    assert parsed.complete
    assert parsed.reasoning == (reasoning if thinking else "")
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (c.name, json.loads(c.arguments)) for c in calls
    ]
    # Encoding the grammar's text gives the same ids: billed counts are reconstructible.
    assert sim_tokenizer().encode(decode(ids), add_special_tokens=False).ids == ids


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    max_tokens=st.integers(1, 300),
    family=st.sampled_from(["kimi-k2.5", "qwen3"]),
    thinking=st.booleans(),
    tools=st.booleans(),
)
def test_generated_completions_respect_max_tokens_and_count_their_ids(
    seed: int, max_tokens: int, family: str, thinking: bool, tools: bool
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    comp = generate(
        random.Random(seed),
        family=family,
        messages=[{"role": "user", "content": "explain"}],
        tools=[tool] if tools else None,
        max_tokens=max_tokens,
        mean_tokens=80,
        thinking=thinking,
    )
    assert comp.completion_tokens == len(comp.ids) <= max_tokens
    parsed = grammar(family).parse(comp.ids, thinking)
    assert (comp.finish_reason == "length") == (not parsed.complete)
    if comp.finish_reason == "tool_calls":
        assert comp.tool_calls and comp.tool_calls[0]["function"]["name"] == "lookup"


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*WORDS, "Zürich", "x", "", " ", '{"a": 1}']), max_size=12).map(
        " ".join
    )
)
def test_fast_word_encoding_equals_the_tokenizer(text: str) -> None:
    from regen.sim.grammar import _encode

    tok = sim_tokenizer()
    assert _encode(tok, text) == (tok.encode(text, add_special_tokens=False).ids if text else [])
