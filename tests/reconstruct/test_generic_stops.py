"""The generic family takes its stop from what the model folder says (generation_config.json,
tokenizer_config.json's eos_token, the template's own end of turn) and refuses when these
disagree; a template that holds a hand-ruled family's marks but is not one its rules were
checked on gets the template-driven family."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow
from tests.reconstruct.folders import model_folder

TEMPLATES = Path(__file__).parent / "templates"
PHI_SPECIALS = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]


def _row(content: str = "2 + 2 = 4.") -> ExportRow:
    history = [{"role": "user", "content": "What is 2 + 2?"}]
    return ExportRow(
        item_id="phi",
        turn_index=1,
        conversation={"messages": [*history, {"role": "assistant", "content": ""}]},
        content=content,
        reasoning=None,
        tool_calls=[],
        finish_reason="stop",
    )


def _phi(tmp_path: Path, generation_eos: list[str] | None) -> Target:
    folder = model_folder(
        tmp_path / "phi-3.5",
        (TEMPLATES / "corpus" / "microsoft-Phi-3.5-mini-instruct.jinja").read_text("utf-8"),
        PHI_SPECIALS,
        eos="<|endoftext|>",
        generation_eos=generation_eos,
    )
    return Target(TargetSpec(family="auto", tokenizer=str(folder), thinking=False))


def test_phi35_with_its_generation_config_ends_at_end(tmp_path: Path) -> None:
    """Phi-3.5's generation_config.json: eos_token_id [32007, 32001, 32000], that is
    `<|end|>`, `<|assistant|>`, `<|endoftext|>`."""
    t = _phi(tmp_path, ["<|end|>", "<|assistant|>", "<|endoftext|>"])
    assert t.family.name == "template"
    [sample] = t.samples([_row()])
    assert not isinstance(sample, Exception), sample
    assert t.decode(sample.completion_ids) == "2 + 2 = 4.<|end|>"


def test_phi35_without_generation_config_is_refused_not_guessed(tmp_path: Path) -> None:
    """The template ends a turn with `<|end|>`, the tokenizer's eos is `<|endoftext|>`:
    nothing in the folder says which the model stops at (regen used to write
    `<|end|>\\n<|endoftext|>`)."""
    t = _phi(tmp_path, None)
    [sample] = t.samples([_row()])
    assert isinstance(sample, Exception)
    line = str(sample)
    assert "\n" not in line and "ends a turn with '<|end|>'" in line
    assert "'<|endoftext|>'" in line and "generation_config.json" in line
    assert "[reconstruct] stop" in line
    assert any("every answer refused" in n for n in t.notes)
    stopped = Target(TargetSpec(**{**t.spec.__dict__, "stop": "<|end|>"}))
    [sample] = stopped.samples([_row()])
    assert not isinstance(sample, Exception), sample
    assert stopped.decode(sample.completion_ids) == "2 + 2 = 4.<|end|>"


def test_a_generation_config_without_the_templates_end_is_refused(tmp_path: Path) -> None:
    t = _phi(tmp_path, ["<|endoftext|>"])
    [sample] = t.samples([_row()])
    assert isinstance(sample, Exception)
    assert "eos_token_id ['<|endoftext|>'] does not hold" in str(sample)


def _kimi_thinking(tmp_path: Path) -> Target:
    template = str(TEMPLATES / "kimi-k2-thinking.jinja")
    spec = TargetSpec(family="auto", tokenizer="sim", chat_template=template, stop="<|im_end|>")
    return Target(spec)


def test_kimi_k2_thinking_gets_the_template_not_kimi_k2s_rules(tmp_path: Path) -> None:
    """Its template holds Kimi-K2's marks, but writes `<think></think>` for an answer
    without reasoning, which Kimi-K2's rules leave out."""
    t = _kimi_thinking(tmp_path)
    assert t.family.name == "template"
    assert any('set family = "kimi-k2"' in n for n in t.notes)
    [sample] = t.samples([_row("Four.")])
    assert not isinstance(sample, Exception), sample
    assert t.decode(sample.completion_ids) == "<think></think>Four.<|im_end|>"


@pytest.mark.parametrize("name", ["kimi-k2", "kimi-k2.5", "deepseek-r1", "gpt-oss"])
def test_the_templates_hand_rules_were_checked_on_keep_them(name: str) -> None:
    from regen.reconstruct.families import detect

    text = (TEMPLATES / f"{name}.jinja").read_text("utf-8")
    assert detect(text).name == name
    assert detect(text.replace("\n", "\r\n") + "{# a comment #}").name == name
    assert detect(text + " ").name == "template"
