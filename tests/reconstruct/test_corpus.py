"""Model folders of families regen has no rules for (their published chat templates, as
llama.cpp keeps them: templates/corpus/, SOURCES.md), with their generation_config.json and
without: each sample's prompt and completion text equal the template's own render byte for
byte, or the sample is refused (an error, or the self-check) with its reason. No sample is
accepted and different, and the self-check and the audit's parse-back agree.

Every family regen has rules for is checked the same way by test_reference.py,
test_template_families.py and test_own_whitespace.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest

from regen.outputs.audit import reparse
from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow
from tests.reconstruct.folders import model_folder
from tests.reconstruct.render import render


@dataclass(frozen=True)
class Folder:
    template: str
    specials: tuple[str, ...]
    eos: str
    bos: str | None
    generation_eos: tuple[str, ...]
    """generation_config.json's eos_token_id, as the model's repository has it."""


FOLDERS = [
    Folder(
        "ByteDance-Seed-OSS",
        ("<seed:bos>", "<seed:eos>", "<seed:pad>", "<seed:think>", "</seed:think>"),
        "<seed:eos>", "<seed:bos>", ("<seed:eos>",),
    ),
    Folder(
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
         "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>",
         "<|START_THINKING|>", "<|END_THINKING|>"),
        "<|END_OF_TURN_TOKEN|>", "<BOS_TOKEN>", ("<|END_OF_TURN_TOKEN|>",),
    ),
    Folder(
        "Mistral-Small-3.2-24B-Instruct-2506",
        ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
        "</s>", "<s>", ("</s>",),
    ),
    Folder(
        "NVIDIA-Nemotron-Nano-v2",
        ("<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<think>", "</think>"),
        "<SPECIAL_12>", "<s>", ("</s>", "<SPECIAL_12>"),
    ),
    Folder(
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        ("<|begin_of_text|>", "<|im_start|>", "<|im_end|>"),
        "<|im_end|>", "<|begin_of_text|>", ("<|im_end|>",),
    ),
    Folder(
        "Qwen-QwQ-32B",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        "<|im_end|>", None, ("<|im_end|>", "<|endoftext|>"),
    ),
    Folder(
        "google-gemma-2-2b-it",
        ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"),
        "<eos>", "<bos>", ("<eos>", "<end_of_turn>"),
    ),
    Folder(
        "ibm-granite-granite-3.3-2B-Instruct",
        ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<think>", "</think>"),
        "<|end_of_text|>", "<|end_of_text|>", ("<|end_of_text|>",),
    ),
    Folder(
        "meta-llama-Llama-3.3-70B-Instruct",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eot_id|>", "<|eom_id|>"),
        "<|eot_id|>", "<|begin_of_text|>", ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    ),
    Folder(
        "microsoft-Phi-3.5-mini-instruct",
        ("<s>", "<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"),
        "<|endoftext|>", "<s>", ("<|end|>", "<|assistant|>", "<|endoftext|>"),
    ),
]  # fmt: skip

VERDICTS: dict[tuple[str, bool], list[str]] = {}
"""What each folder's samples came to (printed with -s for the report)."""

USER = {"role": "user", "content": "What is 2 + 2?"}
# (name, history, reasoning, content, cut)
SAMPLES: list[tuple[str, list[dict[str, Any]], str, str, bool]] = [
    ("plain", [USER], "", "2 + 2 = 4.", False),
    ("own_whitespace", [USER], "", "  Here:\n```\nx = 2 + 2\n```\n", False),
    (
        "multi_turn",
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Japan?"},
        ],
        "",
        "Tokyo.",
        False,
    ),
    ("reasoning", [USER], "Add them: four.", "4.", False),
    ("cut", [{"role": "user", "content": "Tell me a story."}], "", "Once upon a time", True),
]


def _oracle(f: Folder, history: list[dict[str, Any]], answer: dict[str, Any], stops: list[str],
            cut: bool) -> tuple[str, str | None]:  # fmt: skip
    """(the prompt, the completion the template shows: None where it shows none)."""
    kw = {"bos_token": f.bos or "", "eos_token": f.eos}
    name = f"corpus/{f.template}"
    try:
        prompt = render(name, history, add_generation_prompt=True, **kw)
        full = render(name, [*history, answer], add_generation_prompt=False, **kw)
    except (jinja2.TemplateError, TypeError):  # it refuses the history (Gemma: a system turn)
        return "", None
    if not full.startswith(prompt):
        return prompt, None
    tail = full[len(prompt) :]
    for text in (answer.get("reasoning_content") or "", answer["content"]):
        if text and text not in tail:
            return prompt, None
    if cut:
        return prompt, tail[: tail.index(answer["content"]) + len(answer["content"])]
    found = [(tail.find(s), s) for s in stops if s in tail]
    if not found:
        return prompt, None
    at, stop = min(found)
    return prompt, tail[: at + len(stop)]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Target]:
    out = {}
    base = tmp_path_factory.mktemp("folders")
    for f in FOLDERS:
        text = (Path(__file__).parent / "templates" / "corpus" / f"{f.template}.jinja").read_text()
        for config in (True, False):
            folder = model_folder(
                base / f"{f.template}-{config}", text, list(f.specials), f.eos, f.bos,
                list(f.generation_eos) if config else None,
            )  # fmt: skip
            out[f.template, config] = Target(
                TargetSpec(family="auto", tokenizer=str(folder), thinking=False)
            )
    return out


@pytest.mark.parametrize("config", [True, False], ids=["generation_config", "none"])
@pytest.mark.parametrize("f", FOLDERS, ids=[f.template for f in FOLDERS])
def test_every_sample_is_the_templates_render_or_refused(
    f: Folder, config: bool, made: dict[tuple[str, bool], Target]
) -> None:
    t = made[f.template, config]
    # auto reads Hermes 3's as chatml and QwQ's as qwen3: those rules, checked the same way.
    stops = list(f.generation_eos) if config else [f.eos]
    verdicts = []
    for name, history, reasoning, content, cut in SAMPLES:
        answer: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            answer["reasoning_content"] = reasoning
        prompt, expected = _oracle(f, history, answer, stops, cut)
        row = ExportRow(
            item_id=name,
            turn_index=len(history),
            conversation={"messages": [*history, {"role": "assistant", "content": ""}]},
            content=content,
            reasoning=reasoning or None,
            tool_calls=[],
            finish_reason="length" if cut else "stop",
        )
        [sample] = t.samples([row])
        if isinstance(sample, Exception):
            line = str(sample)
            assert line.startswith(f"{name}: ") and "\n" not in line, line
            verdicts.append(f"{name}: refused")
            continue
        if not cut:  # the audit's parse-back reads finished answers only
            # The self-check catches whatever the parse-back catches (and the audit reports
            # both: rebuild_loses_text, reparse_mismatch).
            back = reparse(row, sample, t)
            assert back is None or sample.lost is not None, (name, back)
        if sample.lost is not None:
            verdicts.append(f"{name}: lost")
            continue
        assert expected is not None, (name, t.decode(sample.completion_ids))
        assert t.decode(sample.prompt_ids) == prompt, name
        assert t.decode(sample.completion_ids) == expected, name
        verdicts.append(f"{name}: exact")
    VERDICTS[f.template, config] = verdicts


def test_most_folders_with_their_generation_config_rebuild_exactly(
    made: dict[tuple[str, bool], Target],
) -> None:
    """Not only refusals: with the model's generation_config.json, most of these templates
    rebuild their plain answers exactly (Command R7B's and QwQ's generation prompts, and
    templates that need tools declared, are refused)."""
    for f in FOLDERS:
        if (f.template, True) not in VERDICTS:
            test_every_sample_is_the_templates_render_or_refused(f, True, made)
    exact = [k for k, v in VERDICTS.items() if k[1] and "plain: exact" in v]
    assert len(exact) >= 6, VERDICTS
