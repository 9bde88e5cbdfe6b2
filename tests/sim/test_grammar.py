"""The simulator's completions are the text the published chat templates write, as ids of the
sim tokenizer, parsed back honestly."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.sim.chat import completion_text, render_prompt
from regen.sim.generate import generate
from regen.sim.grammar import FAMILIES, grammar, sim_tokenizer
from regen.sim.words import WORDS

USER = [{"role": "user", "content": "weather in Paris?"}]


def call(name: str, args: str, cid: str = "functions.get_weather:0") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def answer(reasoning: str, content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "reasoning": reasoning, "tool_calls": calls}


WEATHER = call("get_weather", '{"city": "Paris"}')


def test_kimi_k25_completion_is_what_its_template_writes() -> None:
    text = completion_text("kimi-k2.5", USER, [], True, answer("checks", "so", [WEATHER]))
    assert text == (
        "checks</think>so<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    # An answer without calls: the template drops its reasoning; the model wrote it.
    assert completion_text("kimi-k2.5", USER, [], True, answer("r", "hi", [])) == (
        "r</think>hi<|im_end|>"
    )
    assert completion_text("kimi-k2.5", USER, [], False, answer("", "hi", [])) == "hi<|im_end|>"


def test_qwen3_call_only_answer_starts_with_the_call() -> None:
    text = completion_text("qwen3", USER, [], True, answer("think", "", [WEATHER]))
    assert text == (
        "<think>\nthink\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    off = completion_text("qwen3", USER, [], False, answer("", "", [WEATHER]))
    assert off.startswith("<tool_call>")


def test_kimi_prompt_prefills_think_and_drops_finished_reasoning() -> None:
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning": "old thoughts"},
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "loop thoughts",
            "tool_calls": [call("f", "{}", "functions.f:0")],
        },
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
    ]
    text = render_prompt("kimi-k2.5", msgs, [], thinking=True)
    assert "old thoughts" not in text and "<think></think>a1" in text
    assert "<think>loop thoughts</think>" in text
    assert "## Return of functions.f:0\n42<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    assert render_prompt("kimi-k2.5", msgs[:1], [], thinking=False).endswith("<think></think>")


def test_every_sim_word_is_one_token() -> None:
    tok = sim_tokenizer()
    for w in WORDS:
        assert len(tok.encode(w).ids) == 1 and len(tok.encode(" " + w).ids) == 1


words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)
args = st.dictionaries(
    st.sampled_from(WORDS), st.integers(0, 999) | st.sampled_from(WORDS), max_size=3
).map(json.dumps)
REASONS = {"qwen3", "kimi-k2.5", "deepseek-r1", "glm-4.5", "gpt-oss"}


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    reasoning=words,
    content=words | st.just(""),
    arguments=st.lists(args, max_size=1),
    thinking=st.booleans(),
)
def test_parse_gives_back_what_the_template_wrote(
    family: str, reasoning: str, content: str, arguments: list[str], thinking: bool
) -> None:
    thinking = thinking and family in REASONS or family in ("deepseek-r1", "gpt-oss")
    calls = [call("get_weather", a) for a in arguments]
    if not calls and not content:
        content = "ok"
    text = completion_text(
        family, USER, [], thinking, answer(reasoning if thinking else "", content, calls)
    )
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
    parsed = grammar(family).parse(ids, thinking)
    assert parsed.complete
    assert parsed.reasoning.strip() == (reasoning if thinking else "")
    assert parsed.content.strip() == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", json.loads(a)) for a in arguments
    ]


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
    from regen.sim.tokens import _encode

    tok = sim_tokenizer()
    assert _encode(tok, text) == (tok.encode(text, add_special_tokens=False).ids if text else [])
