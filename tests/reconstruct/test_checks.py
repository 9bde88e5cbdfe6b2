"""What the audit and the target see that a token count cannot: a completion that does not
parse back to the stored answer, a template that reads a special token the tokenizer does not
name, and variables a template reads that regen does not set."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from regen.errors import ConfigError
from regen.outputs.audit import Checks, reparse, sample_problems
from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow
from tests.reconstruct import vocab
from tests.reconstruct.corpus import PARIS, USER, WEATHER, call

TEMPLATES = Path(__file__).parent / "templates"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Target:
    folder = vocab.qwen_folder(tmp_path_factory.mktemp("qwen"))
    spec = TargetSpec(
        family="qwen3", tokenizer=str(folder), chat_template=str(TEMPLATES / "qwen3.jinja")
    )
    return Target(spec)


def call_only(content: str = "", reasoning: str = "Need the tool.") -> ExportRow:
    return ExportRow(
        item_id="call-only",
        turn_index=1,
        conversation={"messages": [USER, {"role": "assistant", "content": ""}], "tools": [WEATHER]},
        content=content,
        reasoning=reasoning,
        tool_calls=[call("call_1", "get_weather", PARIS)],
        finish_reason="tool_calls",
    )


def test_the_audit_sees_a_newline_that_keeps_the_count(
    qwen: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    [good] = qwen.samples([call_only()])
    row = replace(call_only(), completion_tokens=len(good.completion_ids))  # the bill
    assert reparse(row, good, qwen) is None
    # Inject the old mistake: a newline before a call-only answer's first <tool_call>, as a
    # wrong whitespace rule would write it.
    real = qwen.completion_text

    def wrong(row: ExportRow, prompt: str, prefill: str = "") -> str:
        text = real(row, prompt, prefill)
        return text.replace("</think>\n\n<tool_call>", "</think>\n\n\n<tool_call>")

    monkeypatch.setattr(qwen, "completion_text", wrong)
    [bad] = qwen.samples([row])
    assert bad.completion_ids != good.completion_ids
    assert len(bad.completion_ids) == len(good.completion_ids)  # `\n\n` 271 -> `\n\n\n` 1406
    diff = reparse(row, bad, qwen)
    assert diff is not None and diff.startswith("content differs at character 2"), diff
    verdict = sample_problems(row, bad, qwen, Checks())
    assert "reparse_mismatch" in verdict.problems
    assert "length_off_billed" not in verdict.problems
    assert verdict.reparse == diff


def test_both_forms_of_a_stored_answer_parse_back(qwen: Target) -> None:
    """vLLM hands back reasoning and content verbatim; a provider may strip them."""
    for row in (call_only(), call_only("\n\n", "\nNeed the tool.\n")):
        [sample] = qwen.samples([row])
        assert reparse(row, sample, qwen) is None


def test_a_bare_tokenizer_json_without_bos_token_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(vocab.deepseek_folder() / "tokenizer.json", bare / "tokenizer.json")
    spec = TargetSpec(
        family="deepseek-v3",
        tokenizer=str(bare / "tokenizer.json"),
        chat_template=str(TEMPLATES / "deepseek-v3.jinja"),
    )
    with pytest.raises(ConfigError, match="reads bos_token.*tokenizer_config.json"):
        Target(spec)
    # With the model's tokenizer_config.json beside it, or bos_token set by hand, it renders.
    beside = tmp_path / "beside"
    shutil.copytree(bare, beside)
    shutil.copy(vocab.deepseek_folder() / "tokenizer_config.json", beside)
    spec_beside = replace(spec, tokenizer=str(beside / "tokenizer.json"))
    prompt = Target(spec_beside).prompt_text([USER], None)
    assert prompt.startswith("<｜begin▁of▁sentence｜><｜User｜>")
    by_hand = replace(spec, template_kwargs={"bos_token": "<｜begin▁of▁sentence｜>"})
    assert Target(by_hand).prompt_text([USER], None) == prompt


def written(tmp_path: Path, text: str) -> str:
    """A chat template file of this text."""
    template = tmp_path / "t.jinja"
    template.write_text(text)
    return str(template)


def test_a_variable_set_by_model_code_is_named(tmp_path: Path) -> None:
    template = written(
        tmp_path,
        "{% if tools_ts_str %}{{ tools_ts_str }}{% endif %}{{ house_style }}"
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    target = Target(TargetSpec(family="kimi-k2", chat_template=template))
    names = " ".join(target.warnings)
    assert "`house_style`" in names and "`tools_ts_str`" in names
    assert all("template_kwargs" in w for w in target.warnings)
    # Kimi-K2.5's own variable is one regen sets itself, and a set kwarg is not warned about.
    k25 = TargetSpec(family="kimi-k2.5", chat_template=template, template_kwargs={"house_style": 1})
    assert Target(k25).warnings == []
    # The published templates need nothing regen does not set.
    for name, fam in (("qwen3", "qwen3"), ("kimi-k2.5", "kimi-k2.5"), ("gpt-oss", "gpt-oss")):
        t = Target(TargetSpec(family=fam, chat_template=str(TEMPLATES / f"{name}.jinja")))
        assert t.warnings == [], (name, t.warnings)


@pytest.mark.parametrize(
    ("family", "reasoning", "args", "name"),
    [
        ("glm-4.5", "Look it up.", '{"zip": "10001", "flag": "true", "n": 3}', "lookup"),
        ("deepseek-r1", "", '{"q": "x"}', "lookup"),  # empty reasoning, stripped
        ("deepseek-r1", "\nR\n", '{"q": "x"}', "lookup"),  # verbatim reasoning
        ("kimi-k2.5", "R", '{"q": "x"}', "mcp.search"),  # a name with a dot
    ],
)
def test_correct_answers_parse_back(family: str, reasoning: str, args: str, name: str) -> None:
    """Answers rebuilt right are not reported: strings that look like JSON stay strings, a
    dotted tool name stays whole, and empty or verbatim reasoning keeps its newlines."""
    target = Target(TargetSpec(family=family, chat_template=str(_template(family))))
    row = replace(call_only("", reasoning), tool_calls=[call("call_9", name, args)])
    [sample] = target.samples([row])
    assert not isinstance(sample, Exception), sample
    assert reparse(row, sample, target) is None


def _template(family: str) -> Path:
    return TEMPLATES / {"glm-4.5": "glm-4.6.jinja"}.get(family, f"{family}.jinja")


def test_a_generation_block_is_read_through(tmp_path: Path) -> None:
    """transformers' `{% generation %}` tag parses, and what it reads is checked."""
    template = written(
        tmp_path,
        "{% for m in messages %}{% generation %}{{ m.content }}{{ house }}{% endgeneration %}"
        "{% endfor %}",
    )
    target = Target(TargetSpec(family="chatml", chat_template=template))
    assert ["`house`" in w for w in target.warnings] == [True]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('[get_weather(city="Paris")]', "", (("get_weather", {"city": "Paris"}),)),
        (
            '[f(a="x"), g(n=2, xs=[1, "b"], d={"k": None})]',
            "",
            (
                ("f", {"a": "x"}),
                ("g", {"n": 2, "xs": [1, "b"], "d": {"k": None}}),
            ),
        ),  # fmt: skip
        ('<|python_start|>[f(a="x")]<|python_end|>', "", (("f", {"a": "x"}),)),
        (
            '<|python_start|><|python_end|>{"name": "f", "parameters": {"a": 1}}'
            '{"name": "g", "parameters": {}}',
            "",
            (("f", {"a": 1}), ("g", {})),
        ),  # fmt: skip
        # What vLLM's parsers return as content: calls after text, a dotted name, a positional
        # or non-literal argument, an empty or cut list, JSON after text.
        ('Let me check.[f(a="x")]', 'Let me check.[f(a="x")]', ()),
        ('[mod.f(a="x")]', '[mod.f(a="x")]', ()),
        ('[f("x")]', '[f("x")]', ()),
        ("[f(n=-1)]", "[f(n=-1)]", ()),
        ("[]", "[]", ()),
        ('[f(a="x"', '[f(a="x"', ()),
        ('Sure. {"name": "f", "parameters": {}}', 'Sure. {"name": "f", "parameters": {}}', ()),
    ],
)
def test_llama4_calls_are_read_as_vllms_parsers_read_them(
    text: str, content: str, calls: tuple[tuple[str, object], ...]
) -> None:
    from regen.reconstruct.families import FAMILIES
    from regen.reconstruct.parse import parse_syntax

    got = parse_syntax(FAMILIES["llama4"], text + "<|eot|>", FAMILIES["llama4"].stop)
    assert (got.content, got.calls) == (content, calls)
