"""The simulator's completions are the text the published chat templates write, as ids of the
sim tokenizer, parsed back honestly."""

from __future__ import annotations

import hashlib
import json
import random
from importlib import resources
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.sim.chat import completion_text, render, render_prompt
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


NEW = ["glm-4.7", "minimax-m2", "qwen3-coder", "qwen3.5", "kimi-k3", "llama4"]
SWITCHED = [("glm-4.7", True), ("glm-4.7", False), ("minimax-m2", True), ("qwen3-coder", False)]
SWITCHED += [("qwen3.5", True), ("qwen3.5", False), ("kimi-k3", True), ("kimi-k3", False)]
SWITCHED += [("llama4", False)]
STOP = {
    "glm-4.7": ("<|observation|>", "<|user|>"),
    "minimax-m2": ("[e~[",),
    "qwen3-coder": ("<|im_end|>",),
    "qwen3.5": ("<|im_end|>",),
    "kimi-k3": ("<|end_of_msg|>",),
    "llama4": ("<|eot|>",),
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


def weather(city: str, days: int, i: int) -> dict[str, Any]:
    return call("get_weather", json.dumps({"city": city, "days": days}), f"call_{i}")


LOOP = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Zürich and Paris?"},
    answer("two cities", "I will look", [weather("Zürich", 3, 0), weather("Paris", 1, 1)]),
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
]
MULTI = [
    {"role": "user", "content": "hi"},
    answer("greet back", "hello", []),
    {"role": "user", "content": "weather in Paris?"},
]
CORPUS = {  # name: (history, reasoning, content, calls)
    "plain": (USER, "", "sunny all week", []),
    "reasoning": (USER, "the user wants weather", "sunny", []),
    "calls only": (USER, "look it up", "", [weather("Paris", 2, 0)]),
    "content then calls": (USER, "look it up", "Let me check.", [weather("Paris", 2, 0)]),
    "parallel calls": (USER, "two", "", [weather("Paris", 2, 0), weather("123", 5, 1)]),
    "tool loop": (LOOP, "both known", "Sunny in Zürich, rain in Paris.", []),
    "tool loop call": (LOOP, "one more", "", [weather("Oslo", 1, 2)]),
    "multi-turn": (MULTI, "again", "It is sunny.", []),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
@pytest.mark.parametrize(("family", "thinking"), SWITCHED)
def test_new_families_write_corpus_answers_after_their_prompt(
    family: str, thinking: bool, case: str
) -> None:
    """For each corpus-like answer the finished render extends the generation prompt, the
    completion ends with the model's stop token, and the server's parser reads it back
    (reasoning verbatim, XML argument values by the declared schema)."""
    history, reasoning, content, calls = CORPUS[case]
    reasoning = reasoning if thinking else ""
    ans = answer(reasoning, content, calls)
    prompt = render(family, history, TOOLS, thinking, generation=True)
    assert prompt == render_prompt(family, history, TOOLS, thinking)
    full = render(family, [*history, ans], TOOLS, thinking, generation=False)
    text = completion_text(family, history, TOOLS, thinking, ans)
    if thinking and not reasoning and family in ("glm-4.7", "minimax-m2"):
        # The template writes no think block for this answer; the model closes the one the
        # prompt opened.
        assert not full.startswith(prompt)
        assert text.startswith("</think>" if family == "glm-4.7" else "\n</think>\n\n")
    else:
        assert full.startswith(prompt)
        tail = full[len(prompt) :]
        if family == "glm-4.7":  # no stop token in the template: the model's own
            assert text == tail + ("<|observation|>" if calls else "<|user|>")
        else:
            assert tail.startswith(text) and text.endswith(STOP[family])
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
    parsed = grammar(family).parse(ids, thinking, TOOLS)
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    if family == "llama4":
        # vLLM's llama4_pythonic parser: each value the text the template wrote, and calls
        # only from the first character (after text, the whole answer is content).
        want = [(n, {k: str(v) for k, v in a.items()}) for n, a in want]
        if content and calls:
            content, want = text.removesuffix("<|eot|>"), []
    assert parsed.complete
    assert parsed.reasoning.strip() == reasoning
    assert parsed.content.strip() == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == want


def test_new_families_completions_are_what_their_templates_write() -> None:
    ans = answer("r", "C", [weather("Paris", 2, 0)])
    assert completion_text("glm-4.7", USER, TOOLS, True, ans) == (
        "r</think>C<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
    )
    assert completion_text("glm-4.7", USER, [], False, answer("", "hi", [])) == "hi<|user|>"
    assert render_prompt("glm-4.7", USER, [], True).endswith("<|assistant|><think>")
    assert render_prompt("glm-4.7", USER, [], False).endswith("<|assistant|></think>")
    assert completion_text("minimax-m2", USER, TOOLS, True, ans) == (
        'r\n</think>\n\nC\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n<parameter name="days">2</parameter>\n'
        "</invoke>\n</minimax:tool_call>[e~["
    )
    assert render_prompt("minimax-m2", USER, [], True).endswith("]~b]ai\n<think>\n")
    assert completion_text("qwen3-coder", USER, TOOLS, False, ans) == (
        "C\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert completion_text("qwen3.5", USER, TOOLS, True, ans) == (
        "r\n</think>\n\nC\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert render_prompt("qwen3.5", USER, [], False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert completion_text("kimi-k3", USER, TOOLS, True, ans) == (
        "r<|close|>think<|sep|><|open|>response<|sep|>C<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    )
    assert render_prompt("kimi-k3", USER, [], False).endswith(
        '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'
    )


@pytest.mark.parametrize("family", ["glm-4.7", "minimax-m2", "qwen3-coder", "qwen3.5"])
def test_xml_argument_values_follow_the_declared_schema(family: str) -> None:
    """A value declared a string stays the text the model wrote ("123"); without a schema
    the server parses any value that is JSON (as vLLM's parsers do)."""
    thinking = family != "qwen3-coder"
    ans = answer("r" if thinking else "", "", [weather("123", 4, 0)])
    text = completion_text(family, USER, TOOLS, thinking, ans)
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
    with_schema = grammar(family).parse(ids, thinking, TOOLS).calls
    assert json.loads(with_schema[0].arguments) == {"city": "123", "days": 4}
    assert json.loads(grammar(family).parse(ids, thinking).calls[0].arguments) == {
        "city": 123,
        "days": 4,
    }


@pytest.mark.parametrize(
    ("family", "tokens"),
    [
        ("glm-4.7", ["[gMASK]", "<sop>", "<|assistant|>", "<|observation|>", "<|user|>",
                     "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                     "</arg_key>", "<arg_value>", "</arg_value>"]),
        ("minimax-m2", ["]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
                        "</minimax:tool_call>"]),
        ("qwen3-coder", ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]),
        ("qwen3.5", ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                     "</tool_call>"]),
        ("kimi-k3", ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]),
        ("llama4", ["<|begin_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>"]),
    ],
)  # fmt: skip
def test_control_tokens_are_single_special_tokens(family: str, tokens: list[str]) -> None:
    tok = sim_tokenizer()
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    turn = answer("r", "ok", [weather("x", 1, 0)])
    seen = render_prompt(family, LOOP, TOOLS, True) + completion_text(
        family, LOOP, TOOLS, True, turn
    )
    for t in tokens:
        assert t in special and t in seen, t
        assert tok.encode(t, add_special_tokens=False).ids == [tok.token_to_id(t)]


def test_existing_special_token_ids_are_stable() -> None:
    tok = sim_tokenizer()
    assert tok.token_to_id("<|im_end|>") == 2 and tok.token_to_id("</think>") == 13
    assert tok.token_to_id("<tool_call>") == 18 and tok.token_to_id("<|call|>") == 1576
    assert tok.token_to_id("]~!b[") == 1577 and tok.token_to_id("<|end_of_msg|>") == 1585
    assert tok.token_to_id("<|begin_of_text|>") == 1586 and tok.token_to_id("<|image|>") == 1594


words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)
args = st.dictionaries(
    st.sampled_from(WORDS), st.integers(0, 999) | st.sampled_from(WORDS), max_size=3
).map(json.dumps)
REASONS = {
    "qwen3",
    "kimi-k2.5",
    "deepseek-r1",
    "glm-4.5",
    "gpt-oss",
    "glm-4.7",
    "qwen3.5",
    "kimi-k3",
}
ALWAYS = ("deepseek-r1", "gpt-oss", "minimax-m2")  # no switch: these always reason


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
    thinking = thinking and family in REASONS or family in ALWAYS
    calls = [call("get_weather", a) for a in arguments]
    if not calls and not content:
        content = "ok"
    text = completion_text(
        family, USER, [], thinking, answer(reasoning if thinking else "", content, calls)
    )
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
    parsed = grammar(family).parse(ids, thinking)
    want = [json.loads(a) for a in arguments]
    if family == "llama4":  # values as the template's text; calls only without text before
        want = [{k: str(v) for k, v in a.items()} for a in want]
        if content and calls:
            content, want = text.removesuffix("<|eot|>"), []
    assert parsed.complete
    assert parsed.reasoning.strip() == (reasoning if thinking else "")
    assert parsed.content.strip() == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", a) for a in want
    ]


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    max_tokens=st.integers(1, 300),
    family=st.sampled_from(["kimi-k2.5", "qwen3", *NEW]),
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
    parsed = grammar(family).parse(comp.ids, thinking or family in ALWAYS, [tool])
    assert (comp.finish_reason == "length") == (not parsed.complete)
    if comp.finish_reason == "tool_calls":
        assert comp.tool_calls and comp.tool_calls[0]["function"]["name"] == "lookup"
        args = json.loads(comp.tool_calls[0]["function"]["arguments"])
        assert set(args) == {"q"} and isinstance(args["q"], str)  # declared a string


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*WORDS, "Zürich", "x", "", " ", '{"a": 1}']), max_size=12).map(
        " ".join
    )
)
def test_fast_word_encoding_equals_the_tokenizer(text: str) -> None:
    from regen.sim.tokens import encode_words

    tok = sim_tokenizer()
    expected = tok.encode(text, add_special_tokens=False).ids if text else []
    assert encode_words(tok, text) == expected


def test_new_templates_are_the_bytes_their_sources_name() -> None:
    folder = resources.files("regen.sim").joinpath("tokenizer", "templates")
    rows = folder.joinpath("SOURCES.md").read_text(encoding="utf-8").splitlines()
    for family in NEW:
        digest = hashlib.sha256(folder.joinpath(f"{family}.jinja").read_bytes()).hexdigest()
        # The detailed row: file, copy, upstream, licence, verbatim?, sha256.
        [row] = [r for r in rows if r.startswith(f"| {family}.jinja |") and r.count(" | ") == 5]
        assert row.removesuffix(" |").endswith(digest), family


def test_llama4_writes_vllms_pythonic_template_and_reads_calls_as_its_parser() -> None:
    """Llama 4 as vLLM serves it with its pythonic template: a plain answer is its text then
    `<|eot|>`; a call turn is a Python list of calls, every value quoted text; the server
    reads calls only from the answer's first character, values as Python literals."""
    prompt = render_prompt("llama4", USER, [], False)
    assert prompt == (
        "<|begin_of_text|><|header_start|>user<|header_end|>\n\nweather in Paris?<|eot|>"
        "<|header_start|>assistant<|header_end|>\n\n"
    )
    assert completion_text("llama4", USER, TOOLS, False, answer("", "Sunny.", [])) == (
        "Sunny.<|eot|>"
    )
    two = [weather("Paris", 2, 0), call("get_time", "{}", "call_1")]
    text = completion_text("llama4", USER, TOOLS, False, answer("", "", two))
    assert text == '[get_weather(city="Paris", days="2"), get_time()]<|eot|>'

    def parse(text: str) -> tuple[str, list[tuple[str, str]], bool]:
        ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)
        p = grammar("llama4").parse(ids, False, TOOLS)
        return p.content, [(c.name, c.arguments) for c in p.calls], p.complete

    assert parse(text) == (
        "",
        [("get_weather", '{"city": "Paris", "days": "2"}'), ("get_time", "{}")],
        True,
    )
    # Values as literals, the arguments as json.dumps writes them (ASCII escapes).
    assert parse("[f(a=1, b=[True, None], c={'k': 'v'}, d=\"Zürich\")]<|eot|>")[1] == [
        ("f", '{"a": 1, "b": [true, null], "c": {"k": "v"}, "d": "Z\\u00fcrich"}')
    ]
    assert parse('<|python_start|>[f(a="1")]<|python_end|><|eom|>')[1] == [("f", '{"a": "1"}')]
    # Text first, a cut list, a value that is no literal, a dotted name, a positional
    # argument, an empty list: no calls, the whole answer is content.
    for body in (
        'Let me check.[f(a="1")]',
        '[f(a="1"',
        "[f(a=x)]",
        '[m.f(a="1")]',
        '[f("1")]',
        "[]",
        '[f(a="1")] and more',
    ):
        assert parse(body + "<|eot|>") == (body, [], True), body
    # Cut before its <|eot|>, a whole list is still read.
    assert parse('[f(a="1")]') == ("", [("f", '{"a": "1"}')], False)
