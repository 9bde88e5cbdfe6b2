"""Reconstruction: each family's completion decodes to the exact expected text; on the
simulator (whose grammars and prompt renderers are its own code) the rebuilt ids of every
family match the billed counts exactly, tool loops and reasoning included; and over random
answers the simulator's ids, parsed as a server parses them and rebuilt, come back the same."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.reconstruct import FAMILIES, Target, TargetSpec
from regen.sim import SimConfig, sim_in_thread
from regen.sim.chat import completion_text
from regen.sim.grammar import grammar, sim_tokenizer
from regen.state.answers import ExportRow
from tests.conftest import run_cli, write_job, write_rows

FIXTURES = Path(__file__).parents[1] / "sources" / "fixtures"
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def _text(name: str, reasoning: str, content: str, calls: list, *, cut: bool = False,
          thinking: bool = True) -> str:  # fmt: skip
    """The completion regen rebuilds for an answer to one user turn: through the family's
    grammar, or its template (the simulator's copy) and the family's rules."""
    target = Target(TargetSpec(family=name, thinking=thinking))
    row = ExportRow(
        item_id="x",
        turn_index=1,
        conversation={
            "messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant"}],
            "tools": [TOOL_LOOP_TOOLS[0]] if calls else None,
        },
        content=content,
        reasoning=reasoning or None,
        tool_calls=calls,
        finish_reason="length" if cut else "tool_calls" if calls else "stop",
    )
    prompt = target.prompt_text(row.history(), row.conversation.get("tools"))
    return target.completion_text(row, prompt, target.prefill(prompt))


@pytest.mark.parametrize(
    ("name", "thinking", "expected"),
    [
        ("kimi-k2.5", True, "R</think>A<|im_end|>"),
        ("kimi-k2.5", False, "A<|im_end|>"),
        ("kimi-k2", True, "<think>R</think>A<|im_end|>"),
        ("qwen3", True, "<think>\nR\n</think>\n\nA<|im_end|>"),
        ("qwen3", False, "A<|im_end|>"),
        ("deepseek-v3", True, "A<｜end▁of▁sentence｜>"),
        ("deepseek-r1", True, "<think>\nR\n</think>\n\nA<｜end▁of▁sentence｜>"),
        ("glm-4.5", True, "\n<think>R</think>\nA<|user|>"),
        ("glm-4.5", False, "\nA<|user|>"),
        (
            "gpt-oss",
            True,
            "<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final"
            "<|message|>A<|return|>",
        ),
        ("chatml", True, "A<|im_end|>"),
    ],
)
def test_each_family_decodes_to_its_layout(name: str, thinking: bool, expected: str) -> None:
    target = Target(TargetSpec(family=name, thinking=thinking))
    # With thinking off the model writes no reasoning (the prompt pre-filled an empty block).
    reasoning = "R" if name != "deepseek-v3" and thinking else ""
    text = _text(name, reasoning, "A", [], thinking=thinking)
    assert text == expected
    [ids] = target.encode_batch([text])
    assert target.decode(ids) == expected
    # The end-of-turn marker is one control token, not its characters.
    assert target.decode(ids[-1:]) in (
        "<|im_end|>",
        "<｜end▁of▁sentence｜>",
        "<|user|>",
        "<|return|>",
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "kimi-k2.5",
            "R</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
            "<|tool_calls_section_end|><|im_end|>",
        ),
        (
            "qwen3",
            '<think>\nR\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>',
        ),
        (
            "deepseek-r1",
            "<think>\nR\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather"
            '\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
            "<｜end▁of▁sentence｜>",
        ),
        (
            "glm-4.5",
            "\n<think>R</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Paris</arg_value>\n</tool_call><|observation|>",
        ),
        (
            "gpt-oss",
            "<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        ),
    ],
)
def test_tool_call_sections(name: str, expected: str) -> None:
    assert _text(name, "R", "", [CALL]) == expected
    target = Target(TargetSpec(family=name))
    assert target.decode(target.encode_batch([expected])[0]) == expected


def test_reasoning_a_template_cannot_show_is_refused() -> None:
    """With thinking off the prompt pre-fills an empty think block: an answer that still
    carries reasoning cannot have come after it, and is refused rather than rebuilt without."""
    from regen.reconstruct import ReconstructError

    with pytest.raises(ReconstructError, match="does not extend its prompt"):
        _text("qwen3", "R", "A", [], thinking=False)


def test_a_cut_answer_has_no_end_token() -> None:
    assert _text("kimi-k2.5", "still thinking", "", [], cut=True) == "still thinking"
    assert _text("qwen3", "hm", "", [], cut=True) == "<think>\nhm"
    assert _text("gpt-oss", "hm", "", [], cut=True) == "<|channel|>analysis<|message|>hm"
    assert _text("kimi-k2.5", "r", "half an ans", [], cut=True) == "r</think>half an ans"


# On the simulator ----------------------------------------------------------------------------

TOOL_LOOP_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city, déjà vu",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


def _tool_loop(i: int) -> dict:
    """user -> call -> result -> answer -> user -> call -> result -> answer."""
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": f'{{"city": "Paris", "days": {i}}}'},
    }
    return {
        "tools": TOOL_LOOP_TOOLS,
        "messages": [
            {"role": "system", "content": "You check the weather."},
            {"role": "user", "content": f"Weather in Paris for {i} days? Explain."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "And in Oslo? Step by step."},
            {"role": "assistant", "content": "", "tool_calls": [{**call, "id": f"call_{i}b"}]},
            {"role": "tool", "tool_call_id": f"call_{i}b", "content": "snow"},
            {"role": "assistant", "content": "Snow."},
        ],
    }


MODELS = {
    "kimi-k2.5": "moonshotai/kimi-k2.5",
    "kimi-k2": "moonshotai/kimi-k2",
    "qwen3": "qwen/qwen3-8b",
    "deepseek-v3": "deepseek/deepseek-chat-v3",
    "deepseek-r1": "deepseek/deepseek-r1",
    "glm-4.5": "z-ai/glm-4.5",
    "gpt-oss": "openai/gpt-oss-120b",
    "chatml": "sim/chatml",
    "glm-4.7": "z-ai/glm-4.7",
    "minimax-m2": "minimax/minimax-m2",
    "qwen3-coder": "qwen/qwen3-coder",
    "qwen3.5": "qwen/qwen3.5-397b-a17b",
    "kimi-k3": "moonshotai/kimi-k3",
    "llama4": "meta-llama/llama-4-maverick",
}
NOT_SIMULATED = {
    "deepseek-v3.1", "deepseek-v3.2", "deepseek-v4", "deepseek-v4.1", "mistral", "template",
}  # fmt: skip
"""Families with no model in the simulator (V3.1; V3.2, V4, V4.1 and Mistral, whose reference
is their publisher's encoder, which the simulator would have to share with regen) or none of
their own (the generic one)."""


@pytest.mark.parametrize(
    ("name", "thinking"),
    [(f, True) for f in MODELS]
    + [(f, False) for f in ("glm-4.5", "kimi-k2.5", "glm-4.7", "qwen3.5", "kimi-k3")],
)
def test_every_family_matches_the_bill_on_the_simulator(
    tmp_path: Path, name: str, thinking: bool
) -> None:
    assert set(MODELS) == set(FAMILIES) - NOT_SIMULATED
    write_rows(tmp_path / "loops.jsonl", [_tool_loop(i) for i in range(6)])
    shutil.copy(FIXTURES / "b1_glaive.json", tmp_path / "glaive.json")
    rows = [{"messages": [{"role": "user", "content": f"Prove claim {i}"}]} for i in range(12)]
    write_rows(tmp_path / "chat.jsonl", rows)
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[
                ("chat", "chat.jsonl", "openai"),
                ("glaive", "glaive.json", "glaive"),
                ("loops", "loops.jsonl", "openai"),
            ],
            extra=f'[reconstruct]\nfamily = "{name}"\n',
        )
        text = job.read_text().replace("moonshotai/kimi-k2.5", MODELS[name])
        text = text.replace("max_tokens = 512", "max_tokens = 4000")
        if not thinking:
            text = text.replace(
                "temperature = 0.7", "temperature = 0.7\nreasoning = {enabled = false}"
            )
        # Every assistant turn of the glaive rows and the tool loops, with its history.
        text = text.replace('format = "glaive"', 'format = "glaive"\nmode = "each_turn"')
        job.write_text(text + 'mode = "each_turn"\n')
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("audit", str(tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    by_name = {d["name"]: d for d in data["datasets"]}
    assert by_name["loops"]["samples"] >= 20  # four turns each, minus cut answers
    overall = data["overall"]
    assert overall["match_share"] == 1.0 and overall["max_abs_diff"] == 0, overall["worst"]
    assert overall["prompt_match_share"] == 1.0 and overall["prompt_max_abs_diff"] == 0
    assert overall["failed"] == 0, overall["problems"]
    # The tokenized export carries the same ids; every answer is rebuilt.
    res = run_cli("export", str(tmp_path / "out"), "--format", "tokenized")
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = json.loads((tmp_path / "out" / "export" / "tokenized" / "manifest.json").read_text())
    written = sum(sum(d["samples"].values()) for d in manifest["datasets"].values())
    assert written == overall["samples"]
    ids = sum((Counter(d["ids"]) for d in manifest["datasets"].values()), Counter())
    assert ids == {"reconstructed": written}


# Over random answers ---------------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.sampled_from(list("abcdefghij XYZ0123456789.,;:!?'\"()[]{}-_\nçé中🙂\t")),
    max_size=60,
)
ARG_VALUE = st.one_of(st.integers(-1000, 1000), st.booleans(), st.text("abcxyz é", max_size=8))
ARGS = st.dictionaries(st.sampled_from(["city", "n", "flag", "q"]), ARG_VALUE, max_size=3)
THINKING = {"deepseek-r1": True, "gpt-oss": True, "kimi-k2": False, "deepseek-v3": False,
            "llama4": False}  # fmt: skip


SIM_FAMILIES = sorted(set(FAMILIES) - NOT_SIMULATED)
USER = [{"role": "user", "content": "Explain, step by step."}]


def _sim_answer(
    name: str, reasoning: str, content: str, calls: list, thinking: bool, cut: int | None = None
) -> tuple[list[int], ExportRow]:
    """The simulator's ids for an answer (its published template's text, cut at `cut` ids),
    and the answer as regen stores it: what the simulator's parser read in those ids."""
    answer = {
        "role": "assistant",
        "content": content,
        "reasoning": reasoning,
        "tool_calls": [
            {
                "id": f"functions.{n}:{i}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a)},
            }
            for i, (n, a) in enumerate(calls)
        ],
    }
    text = completion_text(name, USER, [], thinking, answer)
    ids = list(sim_tokenizer().encode(text, add_special_tokens=False).ids)[:cut]
    parsed = grammar(name).parse(ids, thinking)
    stored = [
        {
            "id": f"functions.{c.name}:{i}" if name.startswith("kimi") else f"call_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(parsed.calls)
    ]
    row = ExportRow(
        item_id="it",
        turn_index=1,
        conversation={"messages": [*USER, {"role": "assistant", "content": ""}]},
        content=parsed.content,
        reasoning=parsed.reasoning or None,
        tool_calls=stored,
        finish_reason="stop" if parsed.complete else "length",
    )
    return ids, row


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(SIM_FAMILIES),
    reasoning=TEXT,
    content=TEXT,
    calls=st.lists(st.tuples(st.sampled_from(["get_weather", "search"]), ARGS), max_size=2),
    thinking=st.booleans(),
)
def test_simulated_answers_round_trip(
    name: str, reasoning: str, content: str, calls: list, thinking: bool
) -> None:
    """Whatever the simulator's template-written answer, regen rebuilds its exact ids from
    the fields a server returns."""
    thinking = THINKING.get(name, thinking)
    if name == "chatml":
        thinking = False
    if not thinking:
        reasoning = ""
    if name == "gpt-oss":
        calls = calls[:1]  # a harmony turn ends at its first call
    if name in ("qwen3", "glm-4.5", "chatml"):
        # Their parsers strip whitespace around reasoning and content (as providers do): text
        # that starts or ends with it cannot be told from text that does not.
        reasoning, content = reasoning.strip(), content.strip()
    if name == "deepseek-r1":
        reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
    if name in ("glm-4.7", "minimax-m2"):
        # Their servers' parsers strip each argument value: a value's own outer spaces are lost
        # before regen sees the answer.
        calls = [
            (n, {k: v.strip() if isinstance(v, str) else v for k, v in a.items()}) for n, a in calls
        ]
    if FAMILIES[name].from_template:
        # Newlines at either end of a field cannot be told from the template's own separators
        # (a server's parser hands both back together); regen takes them as the separators.
        reasoning, content = reasoning.strip("\n"), content.strip("\n")
    ids, row = _sim_answer(name, reasoning, content, calls, thinking)
    target = Target(TargetSpec(family=name, thinking=thinking))
    [sample] = target.samples([row])
    if name == "minimax-m2" and not reasoning.strip():
        # MiniMax-M2's template writes no think block for an answer without reasoning, which
        # cannot follow its prompt's `<think>\n`: what the model writes then is not shown
        # anywhere regen could check (the simulator assumes `\n</think>\n\n`), so it is refused.
        assert isinstance(sample, Exception) and "does not extend its prompt" in str(sample)
        return
    assert not isinstance(sample, Exception), sample
    assert sample.completion_ids == ids, (target.decode(sample.completion_ids), target.decode(ids))


def test_cut_in_reasoning_round_trips() -> None:
    for name in ("kimi-k2.5", "deepseek-r1", "gpt-oss", "qwen3", "glm-4.5"):
        checked = 0
        for cut in range(2, 12):
            ids, row = _sim_answer(name, "one two three four five six", "the answer", [], True, cut)
            if row.content or not row.reasoning:  # past the reasoning, or in a header
                continue
            target = Target(TargetSpec(family=name))
            [sample] = target.samples([row])
            assert not isinstance(sample, Exception), sample
            assert sample.completion_ids == ids, (name, cut, target.decode(sample.completion_ids))
            checked += 1
        assert checked >= 3, name


def test_the_thinking_switch_follows_what_the_requests_sent() -> None:
    from regen.reconstruct import spec_from_store

    meta = {"family": "kimi-k2.5"}
    assert spec_from_store(meta, {"reasoning": None}).thinking is True
    off = spec_from_store(meta, {"reasoning": {"enabled": False}})
    assert off.thinking is False and off.template_kwargs == {}
    assert spec_from_store(meta, {"reasoning": {"effort": "none"}}).thinking is False
    # vLLM/SGLang: the endpoint's chat_template_kwargs are what the server rendered with.
    served = spec_from_store(meta, None, {"thinking": False})
    assert served.thinking is False and served.template_kwargs == {"thinking": False}
    # A hand-set switch wins over the server's.
    hand = spec_from_store({**meta, "template_kwargs": '{"thinking": true}'}, None, {"thinking": 0})
    assert hand.thinking is True
    oss = spec_from_store({"family": "gpt-oss"}, {"reasoning": {"effort": "high"}})
    assert oss.template_kwargs == {"reasoning_effort": "high"}
    with pytest.raises(Exception, match="no template family"):
        spec_from_store(None, None)
    with pytest.raises(Exception, match="not JSON"):
        spec_from_store({**meta, "template_kwargs": "{oops"}, None)


def test_family_auto_on_a_run_says_what_it_picked_and_audits_clean(tmp_path: Path) -> None:
    """A GLM-4.7 job whose [reconstruct] names no family: `auto` reads the model's chat
    template, says which family it is, and every answer rebuilds to its bill."""
    from importlib import resources

    template = resources.files("regen.sim").joinpath("tokenizer", "templates", "glm-4.7.jinja")
    shutil.copy(str(template), tmp_path / "glm.jinja")
    write_rows(tmp_path / "loops.jsonl", [_tool_loop(i) for i in range(3)])
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("loops", "loops.jsonl", "openai")],
            extra='[reconstruct]\nfamily = "auto"\nchat_template = "glm.jinja"\n',
        )
        text = job.read_text().replace("moonshotai/kimi-k2.5", MODELS["glm-4.7"])
        job.write_text(
            text.replace("max_tokens = 512", "max_tokens = 4000") + 'mode = "each_turn"\n'
        )
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("audit", str(tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "note: family auto: glm-4.7, from its chat template" in res.stderr
    overall = json.loads(res.stdout)["overall"]
    assert overall["samples"] >= 6 and overall["failed"] == 0, overall["problems"]
    assert overall["match_share"] == 1.0 and overall["prompt_match_share"] == 1.0
