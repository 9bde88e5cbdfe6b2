"""What of a kept job's answer times is not the simulated provider's: each answer's time on the
wire less its first-token time and its tokens at the endpoint's speed (both scaled by the
simulator's time scale), per lane and dataset, in the pilot and in the run. What is left is the
simulator's and regen's own work and their queues on the machine's cores; a provider's time
does not hold it, so where the pilot's and the run's differ, the pilot's times drift from the
run's for the bench's sake, not the provider's. The last column is the log of the pilot's mean
time over the run's with the run's overhead in place of the pilot's.

Run: .venv/bin/python bench/sim_overhead.py DIR/realistic-* [--ttft 0.3 --tokens-per-s 100
     --time-scale 0.5] (bench/realistic.py's endpoint; bench/plan.py's: --ttft 0.3
     --time-scale 0.2)
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
from pathlib import Path


def overheads(
    job: Path, first_token_s: float, per_token_s: float
) -> dict[tuple[str, str], dict[bool, list[tuple[float, float]]]]:
    """(lane, dataset) -> {in the pilot: [(time on the wire, overhead)]} of a job's answers."""
    db = sqlite3.connect(f"file:{job / 'out' / 'state.db'}?mode=ro", uri=True)
    try:
        (started,) = db.execute("SELECT min(started_at) FROM runs WHERE kind = 'run'").fetchone()
        rows = db.execute(
            "SELECT a.lane, i.dataset, a.latency_s, l.completion_tokens, a.started_at < ? "
            "FROM attempts a JOIN items i ON i.id = a.item_id "
            "JOIN ledger l ON l.generation_id = a.generation_id "
            "WHERE a.failure_class IS NULL AND l.kind IN ('completion', 'escalated')",
            (started,),
        ).fetchall()
    finally:
        db.close()
    out: dict[tuple[str, str], dict[bool, list[tuple[float, float]]]] = {}
    for lane, ds, seconds, tokens, pilot in rows:
        own = seconds - first_token_s - tokens * per_token_s
        out.setdefault((lane, ds), {True: [], False: []})[bool(pilot)].append((seconds, own))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jobs", type=Path, nargs="+")
    ap.add_argument("--ttft", type=float, default=0.3, help="the endpoint's ttft_s")
    ap.add_argument("--tokens-per-s", type=float, default=100.0)
    ap.add_argument("--time-scale", type=float, default=0.5)
    args = ap.parse_args()
    first, each = args.ttft * args.time_scale, args.time_scale / args.tokens_per_s
    print(
        "| job | lane | dataset | pilot / run overhead ms | pilot / run time, log | same overhead |"
    )
    print("|---|---|---|---|---|---|")
    for job in args.jobs:
        for (lane, ds), parts in sorted(overheads(job, first, each).items()):
            pilot, run = parts[True], parts[False]
            if len(pilot) < 5 or len(run) < 20:
                continue
            tp, tr = (statistics.mean(t for t, _ in p) for p in (pilot, run))
            op, orun = (statistics.mean(o for _, o in p) for p in (pilot, run))
            print(
                f"| {job.name} | {lane} | {ds} | {op * 1000:.0f} / {orun * 1000:.0f} | "
                f"{math.log(tp / tr):+.3f} | {math.log((tp - op + orun) / tr):+.3f} |"
            )


if __name__ == "__main__":
    main()
