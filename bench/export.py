"""How long `regen export` takes for 100,000 samples.

Builds a state.db as a run would leave it (100,000 conversations ingested from JSONL, each
answered with about 300 words of content and reasoning, and exact token ids for the tokenized
format), then times `regen export` as its own process for each format, with a validation split
and dedup on, the way a user would run it.

Run: .venv/bin/python bench/export.py [--samples 100000]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simproc

from regen.config import load_job
from regen.conversation import Attempt, Message, Outcome, Result, Usage
from regen.sources.ingest import ingest
from regen.state.db import Store

WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "model", "token", "data")


def build(tmp: Path, n: int) -> Path:
    rng = random.Random(0)
    with (tmp / "d.jsonl").open("w") as f:
        for i in range(n):
            text = " ".join(rng.choices(WORDS, k=rng.randint(10, 80)))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i}: {text}"}]}) + "\n")
    (tmp / "job.toml").write_text(
        '[job]\noutput_dir = "out"\n[generation]\nmodel = "m"\n'
        '[[datasets]]\nname = "d"\npath = "d.jsonl"\n'
    )
    job = load_job(tmp / "job.toml")
    store = Store.open(job.output_path)
    ingest(store, job)
    items = [r[0] for r in store._db.execute("SELECT id FROM items")]
    batch: list[Outcome] = []
    for k, item in enumerate(items):
        content = " ".join(rng.choices(WORDS, k=200))
        reasoning = " ".join(rng.choices(WORDS, k=100))
        prompt_ids = tuple(rng.randrange(50000) for _ in range(60))
        completion_ids = tuple(rng.randrange(50000) for _ in range(300))
        r = Result(
            item,
            Message("assistant", content, reasoning=reasoning),
            "stop",
            Usage(60, 300, 100, 0.0008),
            provider="P",
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
        )
        batch.append(Outcome(item, "d", (Attempt(1, time.time(), 1.0, 200),), result=r))
        if len(batch) == 2000 or k == len(items) - 1:
            store.commit_outcomes(batch)
            batch = []
    store.close()
    return job.output_path


def timed_export(out: Path, fmt: str) -> tuple[float, float, dict[str, object]]:
    to = out / "bench-export" / fmt
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "regen",
            "export",
            str(out),
            "--format",
            fmt,
            "--to",
            str(to),
            "--validation",
            "0.02",
            "--dedup",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    manifest = json.loads((to / "manifest.json").read_text())
    return wall, cpu, manifest["datasets"]["d"]["samples"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100_000)
    args = ap.parse_args()
    print(simproc.machine_line())
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        out = build(Path(d), args.samples)
        size = (out / "state.db").stat().st_size / 2**20
        built = time.monotonic() - t0
        print(f"state.db: {args.samples} answers, {size:.0f} MiB, built in {built:.0f} s")
        print("| format | samples | wall s | CPU s |")
        print("|---|---|---|---|")
        for fmt in ("specforge", "openai", "sharegpt", "tokenized"):
            wall, cpu, samples = timed_export(out, fmt)
            print(f"| {fmt} | {samples} | {wall:.1f} | {cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
