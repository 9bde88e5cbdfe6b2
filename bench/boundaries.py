"""Do a lane's slots sit idle where one token-budgeted dataset ends and the next begins?

Three datasets in one lane of `--concurrency` slots, each with a token budget that its rows
could fill several times over, then a fourth without a budget (so that every budgeted
dataset's end is a boundary, not the run's end), on a simulator whose capacity is above the
lane's (so the lane's limit stays at its concurrency and any gap is the dispatcher's). From
the attempts in state.db (each one's start and latency) the bench rebuilds how many requests
were in flight at every moment, and prints the lane's idle slot-time while work remained (from
the first request to the last one sent; the drain after it is the run's natural end, not a
boundary) as a share of its slot-time, with the longest stretch spent below half the slots.

Target (issue 37): idle under 2% of the wall time. Before the fix, the lane waited at each
boundary for the budgeted dataset's last requests to return.

Run: .venv/bin/python bench/boundaries.py [--concurrency 128] [--budget 300000] [--rows 6000]
     [--last-rows 1500] [--time-scale 0.25] [--seeds 1]
     [--src DIR]   (DIR: another checkout's src folder, to compare with)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simproc

SIM_TOML = """
seed = {seed}
time_scale = {time_scale}

[[models]]
id = "bench/model"
mean_completion_tokens = 150

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.3
tokens_per_s = 60
prompt_price = 0.0000006
completion_price = 0.0000025
capacity = {capacity}
"""

JOB_TOML = """
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "BENCH_KEY"

[generation]
model = "bench/model"
max_tokens = 2000

[run]
concurrency = {concurrency}
initial_limit = {concurrency}
shuffle_seed = {seed}
{datasets}
"""

DATASETS = ("functions", "code", "chat", "agent")
"""The first three have a token budget; the last is sent whole."""


def write_inputs(tmp: Path, rows: int, last_rows: int, budget: int, seed: int) -> str:
    """Each dataset's rows (prompt lengths vary, so answers do), and its job blocks."""
    rng = random.Random(seed)
    blocks = []
    for name in DATASETS:
        last = name == DATASETS[-1]
        with (tmp / f"{name}.jsonl").open("w") as f:
            for i in range(last_rows if last else rows):
                words = " ".join(rng.choices(simproc.FILLER, k=rng.randint(5, 400)))
                f.write(json.dumps({"messages": [{"role": "user", "content": f"{i} {words}"}]}))
                f.write("\n")
        blocks.append(
            f'[[datasets]]\nname = "{name}"\npath = "{name}.jsonl"\nformat = "openai"\n'
            + ("" if last else f"token_budget = {budget}\n")
        )
    return "\n".join(blocks)


def idle_share(db: Path, concurrency: int) -> tuple[float, float, float, dict[str, float]]:
    """(idle share of slot-time while work remained, that span in s, the longest stretch below
    half the slots in s, each dataset's last send as seconds from the start)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT a.started_at, a.latency_s, i.dataset FROM attempts a "
            "JOIN items i ON i.id = a.item_id ORDER BY a.started_at"
        ).fetchall()
    finally:
        con.close()
    t0, t_end = rows[0][0], rows[-1][0]
    events = sorted(
        [(start, 1) for start, _, _ in rows] + [(start + lat, -1) for start, lat, _ in rows]
    )
    idle = 0.0
    in_flight, last = 0, t0
    low_since: float | None = None
    longest_low = 0.0
    for t, step in events:
        if t > t_end:
            t = t_end
        if t > last:
            idle += max(0, concurrency - in_flight) * (t - last)
            if in_flight < concurrency / 2:
                low_since = last if low_since is None else low_since
                longest_low = max(longest_low, t - low_since)
            else:
                low_since = None
            last = t
        in_flight += step
    span = t_end - t0
    last_sent = {ds: start - t0 for start, _, ds in rows}
    return idle / (concurrency * span), span, longest_low, last_sent


def one_run(args: argparse.Namespace, seed: int) -> tuple[float, float, float, dict[str, float]]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sim, base_url = simproc.start_sim(
            SIM_TOML.format(seed=seed, time_scale=args.time_scale, capacity=2 * args.concurrency),
            tmp,
        )
        try:
            datasets = write_inputs(tmp, args.rows, args.last_rows, args.budget, seed)
            job = tmp / "job.toml"
            job.write_text(
                JOB_TOML.format(
                    base_url=base_url, concurrency=args.concurrency, seed=seed, datasets=datasets
                )
            )
            env = {**os.environ, "BENCH_KEY": "bench"}
            if args.src:
                env["PYTHONPATH"] = str(Path(args.src).resolve())
            regen = ["taskset", "-c", "1", sys.executable, "-m", "regen"]
            started = time.monotonic()
            subprocess.run(
                [*regen, "run", str(job)], env=env, check=True, stdout=subprocess.DEVNULL
            )
            print(f"  seed {seed}: run took {time.monotonic() - started:.1f} s", file=sys.stderr)
            return idle_share(tmp / "out" / "state.db", args.concurrency)
        finally:
            sim.terminate()
            sim.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--budget", type=int, default=300_000, help="completion tokens per dataset")
    p.add_argument("--rows", type=int, default=6000, help="rows per budgeted dataset")
    p.add_argument("--last-rows", type=int, default=1500, help="rows of the last dataset")
    p.add_argument("--time-scale", type=float, default=0.25)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--src", help="run regen from this src folder (another checkout)")
    args = p.parse_args()
    print(simproc.machine_line())
    print(
        f"3 datasets x {args.rows} rows, token budget {args.budget:,} each, then "
        f"{args.last_rows} rows without a budget; one lane of "
        f"{args.concurrency} slots, time scale {args.time_scale}"
        + (f", regen from {args.src}" if args.src else "")
    )
    print("seed | idle while work remained | span | longest stretch < half | last sends (s)")
    for seed in range(1, args.seeds + 1):
        idle, span, low, last_sent = one_run(args, seed)
        sends = ", ".join(f"{ds} {t:.1f}" for ds, t in last_sent.items())
        print(f"{seed} | {100 * idle:.2f}% | {span:.1f} s | {low:.1f} s | {sends}")


if __name__ == "__main__":
    main()
