"""The answer's text is the model's, byte for byte: whitespace the model wrote at the start or
the end of its reasoning or content (a code block's closing newline, an indent) stays in the
completion, in every family whose published template shows it.

The oracle is each reference test's own (test_reference.py, test_template_families.py): the
published template's render of the answer as the model wrote it, and the fields as vLLM's
parsers hand them back from that text (verbatim) or as a provider strips them.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest

from regen.outputs.audit import Checks, reparse, sample_problems
from tests.reconstruct import test_reference as ref
from tests.reconstruct import test_template_families as fam
from tests.reconstruct.corpus import PARIS, USER, WEATHER, Case, call

CASES = [
    Case(
        "ends_in_newline",
        [{"role": "user", "content": "Write x = 1 in a code block."}],
        "\n  A code block, then nothing else.  \n",
        "  Here:\n```python\nx = 1\n```\n",
    ),
    Case(
        "starts_with_newline",
        [{"role": "user", "content": "Indent it."}],
        " Indent by four. ",
        "\n    indented\n\n",
    ),
    Case(
        "calls_after_spaces",
        [USER],
        "Look it up.\n",
        "Checking.  ",
        [call("call_w1", "get_weather", PARIS)],
        [WEATHER],
    ),
]


def _params() -> list[Any]:
    out = []
    for mod in (ref, fam):
        for m in mod.MODELS:
            for thinking in mod.thinking_modes(m):
                for case in CASES:
                    name = f"{m.template if mod is ref else m.name}-{thinking}-{case.name}"
                    out.append(pytest.param(mod, m, thinking, case, id=name))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("ws")
    return {
        "qwen": str(ref.vocab.qwen_folder(base / "qwen")),
        "qwen3.5": str(ref.vocab.qwen35_folder(base / "qwen3.5")),
        "deepseek": str(ref.vocab.deepseek_folder()),
        "deepseek-v4": str(ref.vocab.deepseek_v4_folder()),
        "deepseek-v3.2": str(fam.dsv32_folder(base)),
        "harmony": str(ref.vocab.gpt_oss_folder(base / "o200k", base / "gpt-oss")),
        "sim": "sim",
    }


def _skip_what_the_reference_skips(mod: ModuleType, m: Any, case: Case) -> None:
    if mod is ref and m.family == "gpt-oss" and case.calls:
        pytest.skip("gpt-oss calls: test_harmony.py checks them with harmony's parser")
    if mod is fam and not m.calls_after_text and case.calls:
        pytest.skip("vLLM's Llama 4 parsers read text then calls as content")


@pytest.mark.parametrize(("mod", "m", "thinking", "case"), _params())
@pytest.mark.parametrize("form", ["verbatim", "stripped"])
def test_the_models_own_whitespace_is_kept(
    mod: ModuleType, m: Any, thinking: bool, case: Case, form: str, folders: dict[str, str]
) -> None:
    _skip_what_the_reference_skips(mod, m, case)
    t = mod.target(m, thinking, folders)
    a = mod.model_answer(m, case, thinking)
    if mod is fam and not fam.shows(m, a, thinking):
        [sample] = t.samples([fam.stored_row(a, "", a.content)])
        assert isinstance(sample, Exception)
        return
    expected = mod.expected_completion(m, a, thinking)
    reasoning, content = mod.vllm_fields(m, expected, thinking)
    if form == "stripped":
        # A provider that strips fields lost the model's own whitespace: the template's
        # render of what is left is all regen can give, and the audit compares it so.
        reasoning, content = reasoning.strip(), content.strip()
    row = (
        ref.stored_row(a, reasoning, content, case.calls)
        if mod is ref
        else fam.stored_row(a, reasoning, content)
    )
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception), sample
    if form == "verbatim":
        assert t.decode(sample.completion_ids) == expected
    assert sample.lost is None, sample.lost
    [p_ids, c_ids] = t.encode_batch([mod.oracle_prompt(m, a, thinking), expected])
    billed = replace(row, prompt_tokens=len(p_ids), completion_tokens=len(c_ids))
    [sample] = t.samples([billed])
    assert not isinstance(sample, Exception), sample
    assert reparse(billed, sample, t) is None
    if form == "verbatim":
        assert sample_problems(billed, sample, t, Checks()).problems == []


def test_the_self_check_sees_a_dropped_newline() -> None:
    """The self-check compares the stored fields as they are: a rebuild that drops the
    model's closing newline (`...```<|im_end|>` for `...```\\n<|im_end|>`) loses text, as the
    audit's parse-back says (reparse_mismatch)."""
    from regen.reconstruct.check import lost
    from regen.reconstruct.families import Answer

    a = Answer("", "Here:\n```\nx\n```\n", [], truncated=False, thinking=False)
    assert lost(a, "Here:\n```\nx\n```\n<|im_end|>") is None
    missing = lost(a, "Here:\n```\nx\n```<|im_end|>")
    assert missing is not None and missing.startswith("content"), missing
