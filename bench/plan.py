"""Can you bet money on `regen plan`? For each workload: a 30-item pilot (`regen plan --pilot
30 --json`), then the run; the plan's dollars and wall time against what the run then spent and
took, and the ETA shown at 10% of the run against the time that was actually left.

Workloads differ in what makes planning hard: skewed answer lengths across datasets; two lanes
where a short lane escalates truncated answers to a long one; faults (5xx, 408, cut connections
that are billed, errors in a 200); a provider whose capacity is below the lane's concurrency
(429s; the adaptive limit settles); and the skewed datasets with 4 samples per prompt. The
simulator runs as its own process (core 0), `regen` as another (core 1), scaled in time
(`--time-scale`).

Targets (issue 21): cost within 15% and wall time within 25% on every workload; the ETA at
10% of the run within 15% of the actual remaining time.

Run: .venv/bin/python bench/plan.py [--items 3000] [--time-scale 0.2] [--seeds 1]
     [--first-seed 1] [--only NAME] [--pilot 30] [--keep DIR]
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
from dataclasses import dataclass
from pathlib import Path

import simproc

SIM_TOML = """
seed = {seed}
time_scale = {time_scale}
retry_after_s = 0.2

[faults]
padding = 0.1
keepalive = 0.5
{faults}

[[models]]
id = "bench/model"
mean_completion_tokens = 150

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.3
tokens_per_s = 100
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
max_tokens = 4000
{generation}

[run]
concurrency = {concurrency}
initial_limit = {concurrency}
progress_interval_s = 1
shuffle_seed = {seed}
{lanes}
"""


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    datasets: dict[str, tuple[float, float, float]]
    """name -> shares of (short question, code task, long hint-laden prompt)."""
    lanes: str = ""
    faults: str = ""
    capacity: int = 0
    concurrency: int = 32
    samples: int = 1
    """Answers per prompt ([generation] samples): the rows are the items / samples."""


WORKLOADS = [
    Workload(
        "skewed",
        "3 datasets of very different answer lengths, one lane",
        {
            "chat": (0.9, 0.1, 0.0),
            "code": (0.2, 0.7, 0.1),
            "reasoning": (0.1, 0.3, 0.6),
        },
    ),
    Workload(
        "lanes",
        "short lane (max_tokens 300) escalating truncated answers to a long lane",
        {"chat": (0.7, 0.2, 0.1), "code": (0.2, 0.5, 0.3)},
        lanes="""
[[lanes]]
name = "short"
concurrency = 32
max_tokens = 300
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 16
max_tokens = 4000
""",
    ),
    Workload(
        "faults",
        "5xx 4%, 408 2%, cut connections 2% (billed), errors in a 200 1%",
        {"chat": (0.7, 0.2, 0.1), "code": (0.2, 0.6, 0.2)},
        faults="http_5xx = 0.04\nhttp_408 = 0.02\nreset = 0.02\nerror_200 = 0.01",
    ),
    Workload(
        "capacity",
        "provider capacity 20 under a lane of 64: 429s, the adaptive limit settles",
        {"chat": (0.7, 0.2, 0.1), "code": (0.3, 0.5, 0.2)},
        capacity=20,
        concurrency=64,
    ),
    Workload(
        "samples",
        "the skewed datasets with 4 samples per prompt and a temperature mix (issue 35)",
        {
            "chat": (0.9, 0.1, 0.0),
            "code": (0.2, 0.7, 0.1),
            "reasoning": (0.1, 0.3, 0.6),
        },
        samples=4,
    ),
]


def rows(n: int, shares: tuple[float, float, float], rng: random.Random) -> list[str]:
    out = []
    for i in range(n):
        roll = rng.random()
        if roll < shares[0]:
            text = f"Question {i}: what is {rng.choice(simproc.FILLER)}?"
        elif roll < shares[0] + shares[1]:
            text = f"Task {i}: explain and write code for {rng.choice(simproc.FILLER)}."
        else:
            words = " ".join(rng.choices(simproc.FILLER, k=300))
            text = f"Task {i}: prove, derive, explain step by step and implement: {words}"
        out.append(json.dumps({"messages": [{"role": "user", "content": text}]}))
    return out


def progress_lines(log: Path) -> list[tuple[float, dict[str, str]]]:
    """(unix time, fields) of each progress line."""
    out = []
    for line in log.read_text().splitlines():
        stamp, _, rest = line.partition(" progress ")
        if rest:
            t = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            out.append((t, dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)))
    return out


def one(
    w: Workload, items: int, seed: int, time_scale: float, tmp: Path, pilot: int
) -> dict[str, float]:
    sim, base_url = simproc.start_sim(
        SIM_TOML.format(seed=seed, time_scale=time_scale, faults=w.faults, capacity=w.capacity),
        tmp,
    )
    work = tmp / f"{w.name}-{seed}"
    work.mkdir()
    try:
        rng = random.Random(seed)
        blocks = ""
        per = items // len(w.datasets) // w.samples
        for name, shares in w.datasets.items():
            (work / f"{name}.jsonl").write_text("\n".join(rows(per, shares, rng)) + "\n")
            blocks += f'\n[[datasets]]\nname = "{name}"\npath = "{name}.jsonl"\n'
        job = work / "job.toml"
        job.write_text(
            JOB_TOML.format(
                base_url=base_url,
                concurrency=w.concurrency,
                seed=seed,
                lanes=w.lanes,
                generation=(
                    f"samples = {w.samples}\ntemperature = [0.3, 0.8, 1.1]" if w.samples > 1 else ""
                ),
            )
            + blocks
        )
        env = {**os.environ, "BENCH_KEY": "sk-bench"}
        regen = ["taskset", "-c", "1", sys.executable, "-m", "regen"]
        out = subprocess.run(
            [*regen, "plan", str(job), "--pilot", str(pilot), "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        plan = json.loads(out.stdout)
        (work / "plan.json").write_text(out.stdout)
        subprocess.run([*regen, "run", str(job)], env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        sim.terminate()
        sim.wait()
    db = sqlite3.connect(work / "out" / "state.db")
    (pilot_end,) = db.execute("SELECT ended_at FROM runs WHERE kind = 'pilot'").fetchone()
    started, ended = db.execute(
        "SELECT started_at, ended_at FROM runs WHERE kind = 'run'"
    ).fetchone()
    (cost,) = db.execute(
        "SELECT SUM(COALESCE(cost_usd, 0)) FROM ledger WHERE created_at > ?", (pilot_end,)
    ).fetchone()
    (done0,) = db.execute(
        "SELECT COUNT(*) FROM items WHERE status != 'pending' AND updated_at <= ?", (pilot_end,)
    ).fetchone()
    (total,) = db.execute("SELECT COUNT(*) FROM items").fetchone()
    (escalated,) = db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'escalated'").fetchone()
    (r429,) = db.execute("SELECT COUNT(*) FROM attempts WHERE status = 429").fetchone()
    db.close()
    wall = ended - started
    lines = [(t, f) for t, f in progress_lines(work / "out" / "run.log") if t >= started - 1]
    # "At 10% of the run", two ways: when 10% of its items are finished (a fast short lane
    # gets there early), and when 10% of its time has passed.
    eta_at = eta_actual = eta_t = eta_t_actual = float("nan")
    for t, f in lines:
        done = int(f["done"].split("/")[0]) + int(f.get("failed", "0"))
        if done - done0 >= 0.1 * (total - done0) and f["eta_s"] != "-":
            eta_at, eta_actual = float(f["eta_s"]), ended - t
            break
    for t, f in lines:
        if t - started >= 0.1 * wall and f["eta_s"] != "-":
            eta_t, eta_t_actual = float(f["eta_s"]), ended - t
            break
    return {
        "plan_cost": plan["job"]["cost_usd"]["mean"],
        "plan_cost_p10": plan["job"]["cost_usd"]["p10"],
        "plan_cost_p90": plan["job"]["cost_usd"]["p90"],
        "cost": cost,
        "plan_wall": plan["job"]["time_s"]["mean"],
        "plan_wall_p10": plan["job"]["time_s"]["p10"],
        "plan_wall_p90": plan["job"]["time_s"]["p90"],
        "wall": wall,
        "eta": eta_at,
        "eta_actual": eta_actual,
        "eta_t": eta_t,
        "eta_t_actual": eta_t_actual,
        "escalated": escalated,
        "r429": r429,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--only", default=None)
    ap.add_argument("--pilot", type=int, default=30, help="items per dataset in the pilot")
    ap.add_argument("--keep", type=Path, help="keep each workload's files here")
    args = ap.parse_args()
    print(simproc.machine_line())
    print(
        f"items per workload: {args.items}, time scale {args.time_scale}, "
        f"pilot {args.pilot} per dataset"
    )
    print(
        "| workload | seed | plan $ (p10-p90) | actual $ | error | plan wall s (p10-p90) | "
        "actual s | error | ETA at 10% of items: s / left / error | "
        "at 10% of the time: s / left / error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = {"cost": 0.0, "wall": 0.0, "eta": 0.0, "eta_t": 0.0}
    with tempfile.TemporaryDirectory() as d:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        for w in WORKLOADS:
            if args.only and w.name != args.only:
                continue
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                r = one(w, args.items, seed, args.time_scale, args.keep or Path(d), args.pilot)
                ec = r["plan_cost"] / r["cost"] - 1
                ew = r["plan_wall"] / r["wall"] - 1
                ee = r["eta"] / r["eta_actual"] - 1
                et = r["eta_t"] / r["eta_t_actual"] - 1
                worst["cost"] = max(worst["cost"], abs(ec))
                worst["wall"] = max(worst["wall"], abs(ew))
                worst["eta"] = max(worst["eta"], abs(ee))
                worst["eta_t"] = max(worst["eta_t"], abs(et))
                print(
                    f"| {w.name} | {seed} | {r['plan_cost']:.4f} ({r['plan_cost_p10']:.4f}-"
                    f"{r['plan_cost_p90']:.4f}) | {r['cost']:.4f} | {ec:+.1%} | "
                    f"{r['plan_wall']:.1f} ({r['plan_wall_p10']:.1f}-{r['plan_wall_p90']:.1f}) | "
                    f"{r['wall']:.1f} | {ew:+.1%} | {r['eta']:.0f} / {r['eta_actual']:.0f} / "
                    f"{ee:+.1%} | {r['eta_t']:.0f} / {r['eta_t_actual']:.0f} / {et:+.1%} |",
                    flush=True,
                )
    print(
        f"worst: cost {worst['cost']:.1%} (target 15%), wall {worst['wall']:.1%} (target 25%), "
        f"ETA at 10% of items {worst['eta']:.1%}, at 10% of the time {worst['eta_t']:.1%} "
        "(target 15%)"
    )


if __name__ == "__main__":
    main()
