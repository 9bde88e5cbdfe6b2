"""How honest is the ETA? Run a job on the simulator and compare the ETA shown with the time
that was actually left.

The dataset mixes short chat prompts with long, hint-laden ones, so completion lengths (and
latencies) are a skewed mixture: the case where early rates mislead. The simulator runs as its
own process (`--time-scale` 0.25: a quarter of the modelled latencies), `regen run` as
another; the script reads the `progress` lines of run.log (one a second) and, at 10%, 25% and
50% of the items done, compares `eta_s` with the seconds the run then took, and checks that
`eta_p10_s`..`eta_p90_s` holds it.

Run: .venv/bin/python bench/eta.py [--items 20000] [--concurrency 64] [--rounds 3]
     [--time-scale 0.25]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simproc

SIM_TOML = """
seed = {seed}
time_scale = {time_scale}

[faults]
padding = 0.1
keepalive = 0.5

[[models]]
id = "bench/model"
mean_completion_tokens = 100

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.2
tokens_per_s = 100
"""

JOB_TOML = """
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "BENCH_KEY"

[generation]
model = "bench/model"
max_tokens = 4000

[run]
concurrency = {concurrency}
initial_limit = {concurrency}
progress_interval_s = 1
shuffle_seed = {seed}

[[datasets]]
name = "mixed"
path = "mixed.jsonl"
"""


def mixed_rows(n: int, rng: random.Random) -> list[dict[str, object]]:
    """70% short questions, 20% asking to explain and write code, 10% long prompts with many
    hints: the simulator's answer lengths grow with prompt length and hints."""
    rows = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.7:
            text = f"Question {i}: what is {rng.choice(simproc.FILLER)}?"
        elif roll < 0.9:
            text = f"Task {i}: explain and write code for {rng.choice(simproc.FILLER)}."
        else:
            words = " ".join(rng.choices(simproc.FILLER, k=400))
            text = f"Task {i}: prove, derive, explain step by step and implement: {words}"
        rows.append({"messages": [{"role": "user", "content": text}]})
    return rows


def progress_lines(log: Path) -> list[dict[str, str]]:
    out = []
    for line in log.read_text().splitlines():
        stamp, _, rest = line.partition(" progress ")
        if rest:
            fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
            out.append(fields)
    return out


def one_round(
    items: int, concurrency: int, seed: int, tmp: Path, time_scale: float
) -> list[dict[str, object]]:
    sim, base_url = simproc.start_sim(SIM_TOML.format(seed=seed, time_scale=time_scale), tmp)
    try:
        work = tmp / f"round-{seed}"
        work.mkdir()
        rng = random.Random(seed)
        with (work / "mixed.jsonl").open("w") as f:
            for row in mixed_rows(items, rng):
                f.write(json.dumps(row) + "\n")
        (work / "job.toml").write_text(
            JOB_TOML.format(base_url=base_url, concurrency=concurrency, seed=seed)
        )
        env = {**os.environ, "BENCH_KEY": "sk-bench"}
        t0 = time.monotonic()
        subprocess.run(
            ["taskset", "-c", "1", sys.executable, "-m", "regen", "run", str(work / "job.toml")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.monotonic() - t0
    finally:
        sim.terminate()
        sim.wait()
    lines = progress_lines(work / "out" / "run.log")
    end = float(lines[-1]["elapsed_s"])
    results = []
    for share in (0.10, 0.25, 0.50):
        at = next(
            line
            for line in lines
            if int(line["done"].split("/")[0]) >= share * items and line["eta_s"] != "-"
        )
        actual = end - float(at["elapsed_s"])
        eta, p10, p90 = (float(at[k]) for k in ("eta_s", "eta_p10_s", "eta_p90_s"))
        results.append(
            {
                "seed": seed,
                "progress": share,
                "elapsed_s": float(at["elapsed_s"]),
                "eta_s": eta,
                "p10_s": p10,
                "p90_s": p90,
                "actual_s": actual,
                "error": (eta - actual) / actual,
                "covered": p10 <= actual <= p90,
                "wall_s": wall,
            }
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.25)
    args = ap.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
    print("| seed | at | elapsed s | ETA s | p10-p90 s | actual s | error | in interval |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for row in one_round(args.items, args.concurrency, 11 + r, Path(d), args.time_scale):
                print(
                    f"| {row['seed']} | {row['progress']:.0%} | {row['elapsed_s']:.0f} | "
                    f"{row['eta_s']:.0f} | {row['p10_s']:.0f}-{row['p90_s']:.0f} | "
                    f"{row['actual_s']:.0f} | {row['error']:+.1%} | "
                    f"{'yes' if row['covered'] else 'no'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
