"""One prefill per prompt: a samples job on the simulator's vLLM and SGLang, its samples sent as
one request with `n` per prompt against one request per sample.

    .venv/bin/python bench/samples_n.py [--prompts 200] [--samples 4]

Prints, per dialect and way of sending: requests, the prompt tokens the server prefilled (the
simulator's log: what it billed as prompt), completions, and the wall time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from regen.config import load_job
from regen.run.runner import run_job
from regen.sim import SimConfig, sim_in_thread

MODEL = "qwen/qwen3-8b"


def job_text(base_url: str, dialect: str, samples: int, batched: bool) -> str:
    return f"""
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
dialect = "{dialect}"
api_key_env = "REGEN_NO_KEY_NEEDED"
samples_in_one_request = {str(batched).lower()}

[generation]
model = "{MODEL}"
max_tokens = 400
samples = {samples}

[run]
concurrency = 64
progress_interval_s = 5

[[datasets]]
name = "chat"
path = "chat.jsonl"
"""


def one(dialect: str, prompts: int, samples: int, batched: bool) -> dict[str, float]:
    config = SimConfig(dialect=dialect, served_model=MODEL, seed=1, time_scale=0.02)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp_name, sim_in_thread(config) as sim:
        tmp = Path(tmp_name)
        with (tmp / "chat.jsonl").open("w") as f:
            for i in range(prompts):
                text = f"Question {i}: explain, with an example, how a cache can serve {i} users."
                f.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
        (tmp / "job.toml").write_text(job_text(sim.base_url, dialect, samples, batched))
        started = time.monotonic()
        report = run_job(load_job(tmp / "job.toml"), console=Console(file=io.StringIO()))
        wall = time.monotonic() - started
        log = [e for e in sim.simulator.chat_log() if e.status == 200]
        done = sum(d.done for d in report.datasets)
    return {
        "requests": len(log),
        "prefill": sum(e.prompt_tokens for e in log),
        "completion": sum(e.completion_tokens for e in log),
        "samples": done,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    print(
        f"{args.prompts} prompts x {args.samples} samples; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, nproc {os.cpu_count()}"
    )
    print()
    print(
        "| dialect | sent as | requests | prompt tokens prefilled | completion tokens "
        "| samples stored | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for dialect in ("vllm", "sglang"):
        for batched in (True, False):
            r = one(dialect, args.prompts, args.samples, batched)
            way = f"one request, n = {args.samples}" if batched else "a request per sample"
            print(
                f"| {dialect} | {way} | {r['requests']:,} | {r['prefill']:,} | "
                f"{r['completion']:,} | {r['samples']:,} | {r['wall_s']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
