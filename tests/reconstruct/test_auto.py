"""`family = "auto"` picks the family from the model's own chat template, and `regen families`
says what each family is checked against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.errors import ConfigError
from regen.reconstruct import FAMILIES, Target, TargetSpec
from regen.reconstruct.families import detect
from tests.conftest import run_cli

TEMPLATES = Path(__file__).parent / "templates"

# Each published template (SOURCES.md) and the family it is.
PUBLISHED = {
    "qwen3": "qwen3",
    "qwen2.5": "chatml",
    "qwen3-coder": "qwen3-coder",
    "qwen3.5": "qwen3.5",
    "deepseek-r1": "deepseek-r1",
    "deepseek-v3.1": "deepseek-v3.1",
    "glm-4.6": "glm-4.5",
    "glm-4.7": "glm-4.7",
    "glm-5.2": "glm-4.7",
    "minimax-m2": "minimax-m2",
    "kimi-k2": "kimi-k2",
    "kimi-k2-thinking": "template",  # not the template kimi-k2's rules were checked on
    "kimi-k2.5": "kimi-k2.5",
    "kimi-k3": "kimi-k3",
    "gpt-oss": "gpt-oss",
    "llama4": "llama4",
    "llama4-pythonic": "llama4",
}


@pytest.mark.parametrize(("template", "family"), sorted(PUBLISHED.items()))
def test_auto_picks_each_published_templates_family(template: str, family: str) -> None:
    assert detect((TEMPLATES / f"{template}.jinja").read_text("utf-8")).name == family


def test_every_fixture_template_is_covered() -> None:
    assert {p.stem for p in TEMPLATES.glob("*.jinja")} - set(PUBLISHED) == {"deepseek-v3"}


def test_deepseek_v3_and_r1_share_a_template_and_the_reasoning_setting_decides() -> None:
    text = (TEMPLATES / "deepseek-v3.jinja").read_text("utf-8")
    assert text == (TEMPLATES / "deepseek-r1.jinja").read_text("utf-8")
    assert detect(text, thinking=True).name == "deepseek-r1"
    assert detect(text, thinking=False).name == "deepseek-v3"


def test_an_unknown_template_is_the_generic_family_and_says_so(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    t = Target(TargetSpec(family="auto", chat_template=str(template), tokenizer="sim"))
    assert t.family.name == "template"
    assert any("family auto: template" in n for n in t.notes)
    assert any("self-check" in n for n in t.notes)


def test_auto_names_what_it_picked() -> None:
    t = Target(
        TargetSpec(family="auto", chat_template=str(TEMPLATES / "glm-4.7.jinja"), tokenizer="sim")
    )
    assert t.family.name == "glm-4.7"
    assert t.notes == ["family auto: glm-4.7, from its chat template"]


def test_auto_needs_the_models_template() -> None:
    with pytest.raises(ConfigError, match="auto.*reads the model's chat template"):
        Target(TargetSpec(family="auto", tokenizer="sim"))


def test_regen_families_lists_each_family() -> None:
    res = run_cli("families", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["family"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(FAMILIES)
    assert rows["glm-4.7"]["completion"] == "chat template"
    assert rows["glm-4.7"]["stop_after_calls"] == "<|observation|>"
    assert rows["kimi-k2.5"]["completion"] == "hand-written grammar"
    assert "drops the reasoning" in rows["kimi-k2.5"]["why_grammar"]
    assert rows["mistral"]["completion"] == "mistral-common, the publisher's encoder"
    assert all(r["verified"] for r in rows.values())
    table = run_cli("families")
    assert table.returncode == 0 and "[reconstruct]" in table.stdout
    # The families' own texts are printed as they are, not read as terminal markup.
    cells = " ".join(line.strip("│ ") for line in table.stdout.splitlines())
    assert "unless  stop says" not in cells and "[reconstruct]" in cells.partition("template")[2]


def test_the_generic_family_reads_back_with_the_stop_it_was_given(tmp_path: Path) -> None:
    """A `template` answer ends with the target's stop token (here `[reconstruct] stop`): the
    parse-back takes that same token off, so a right rebuild passes and a wrong one fails."""
    from regen.outputs.audit import reparse
    from regen.state.answers import ExportRow

    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    t = Target(TargetSpec(family="template", chat_template=str(template), stop="<|end|>"))
    row = ExportRow(
        item_id="x",
        turn_index=1,
        conversation={"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
        content="Hello.",
        reasoning=None,
        tool_calls=[],
        finish_reason="stop",
    )
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception), sample
    assert t.decode(sample.completion_ids) == "Hello.<|end|>"
    assert reparse(row, sample, t) is None
    [wrong] = Target(
        TargetSpec(family="template", chat_template=str(template), stop="<|x|>")
    ).samples([row])
    assert isinstance(wrong, Exception) and "writes none of the end tokens" in str(wrong)


def test_auto_picks_deepseek_v32_from_the_encoder_the_model_ships(tmp_path: Path) -> None:
    """DeepSeek-V3.2 has no chat template: its repository ships an encoder file, which regen
    runs from the model's folder only when told to trust the model's code."""
    from tests.reconstruct.test_template_families import dsv32_folder

    folder = str(dsv32_folder(tmp_path))
    t = Target(TargetSpec(family="auto", tokenizer=folder, trust_remote_code=True))
    assert t.family.name == "deepseek-v3.2"
    assert t.notes == ["family auto: deepseek-v3.2, from the model's encoding/encoding_dsv32.py"]
    with pytest.raises(ConfigError, match=r"runs the model's own encoder .* trust_remote_code"):
        Target(TargetSpec(family="deepseek-v3.2", tokenizer=folder))
    (tmp_path / "encoding" / "encoding_dsv32.py").unlink()
    with pytest.raises(ConfigError, match=r"encoding/encoding_dsv32\.py\), which tokenizer"):
        Target(TargetSpec(family="deepseek-v3.2", tokenizer=folder, trust_remote_code=True))
