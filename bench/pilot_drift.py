"""How far a pilot's answer times were from the run's, beyond the pilot mean's own error: the
measurement behind EARLIER_DRIFT (engine/eta.py).

For each lane and dataset of a kept job (`bench/plan.py --keep DIR`, `bench/realistic.py
--keep DIR`, or any job directory with `out/state.db` that had a pilot and a run) with at least
MIN_PILOT pilot answers and MIN_RUN run answers: the log of the pilot's mean, adjusted to the
run's prompts as the ETA adjusts it (`Stat.regressed`), over the run's mean, and the variance
that the two means' own errors give it. Then:

- per-flow drift: the d for which the log ratios' z (over sqrt(own variance + d^2)) have a mean
  square of 1, and the d for which |z| stays under the normal's 90th percentile four times in
  five (what the ETA's p10-p90 assumes);
- the part common to a run's flows (the same move for every dataset, as a provider that slows
  down for all would give): the mean log ratio and its spread between runs beyond what the
  per-flow parts explain (method of moments).

Run: PYTHONPATH=src .venv/bin/python bench/pilot_drift.py DIR/*-load0 DIR2/realistic-*
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
from collections.abc import Callable
from pathlib import Path

from regen.engine.eta import Z90, Stat

MIN_PILOT = 10
MIN_RUN = 20


Answer = tuple[float, float, float]
"""A successful attempt: when it started, its time on the wire, its item's estimated prompt
tokens."""


def answers(job: Path) -> dict[tuple[str, str], tuple[list[Answer], list[Answer]]]:
    """Per (lane, dataset) of a kept job, its pilot's answers and its run's (started after
    the first run began), each in the order they started; empty without a run."""
    db = sqlite3.connect(f"file:{job / 'out' / 'state.db'}?mode=ro", uri=True)
    try:
        (started,) = db.execute("SELECT min(started_at) FROM runs WHERE kind = 'run'").fetchone()
        rows = db.execute(
            "SELECT a.lane, i.dataset, a.started_at, a.latency_s, i.prompt_tokens_est "
            "FROM attempts a JOIN items i ON i.id = a.item_id WHERE a.failure_class IS NULL "
            "ORDER BY a.started_at"
        ).fetchall()
    finally:
        db.close()
    out: dict[tuple[str, str], tuple[list[Answer], list[Answer]]] = {}
    if started is None:
        return out
    for lane, ds, t0, latency, prompt in rows:
        pilot, run = out.setdefault((lane, ds), ([], []))
        (pilot if t0 < started else run).append((float(t0), float(latency), float(prompt)))
    return out


def flows(job: Path) -> list[tuple[str, float, float]]:
    """(lane/dataset, log of the pilot's adjusted mean over the run's, its own variance) of the
    job's flows that had enough of both."""
    out = []
    for (lane, ds), (pilot, run) in sorted(answers(job).items()):
        if len(pilot) < MIN_PILOT or len(run) < MIN_RUN:
            continue
        mean = statistics.mean(t for _, t, _ in run)
        to = statistics.mean(p for _, _, p in run)
        est = Stat.regressed([t for _, t, _ in pilot], [p for _, _, p in pilot], to)
        if est.mean <= 0 or mean <= 0:
            continue
        run_rse = statistics.stdev(t for _, t, _ in run) / math.sqrt(len(run)) / mean
        out.append(
            (f"{lane}/{ds}", math.log(est.mean / mean), (est.se / est.mean) ** 2 + run_rse**2)
        )
    return out


def solve(f: Callable[[float], float], lo: float = 0.0, hi: float = 1.0) -> float:
    """The d in [lo, hi] where the decreasing f(d) crosses zero (lo when f(lo) <= 0)."""
    if f(lo) <= 0:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jobs", type=Path, nargs="+")
    ap.add_argument("--each", action="store_true", help="print every flow")
    args = ap.parse_args()
    runs = {job: flows(job) for job in args.jobs}
    every = [(x, v) for found in runs.values() for _, x, v in found]
    if not every:
        raise SystemExit("no flow with a pilot and a run in these jobs")
    if args.each:
        for job, found in runs.items():
            for key, x, v in found:
                print(f"{job.name} {key}: {x:+.3f} (own sd {math.sqrt(v):.3f})")

    def z2(d: float) -> float:
        return statistics.mean(x * x / (v + d * d) for x, v in every)

    def held(d: float) -> float:
        return sum(x * x <= Z90**2 * (v + d * d) for x, v in every) / len(every)

    square = solve(lambda d: z2(d) - 1.0)
    four_in_five = solve(lambda d: 0.8 - held(d))
    print(f"{len(every)} flows in {len(runs)} jobs")
    print(f"own errors alone: mean z^2 {z2(0.0):.2f}, held {held(0.0):.0%}")
    print(f"per-flow drift: mean z^2 of 1 at {square:.3f}, four in five held at {four_in_five:.3f}")
    for d in (0.0, 0.03, 0.06, 0.09, 0.12):
        print(f"  d {d:.2f}: mean z^2 {z2(d):.2f}, held {held(d):.0%}")
    # The common part: each run's mean log ratio, against what its flows' own parts give it.
    per_flow = square**2
    means = [
        (
            statistics.mean(x for _, x, _ in found),
            statistics.mean(v for _, _, v in found),
            len(found),
        )
        for found in runs.values()
        if len(found) >= 2
    ]
    if len(means) >= 2:
        mu = statistics.mean(m for m, _, _ in means)
        common = statistics.mean(m * m - (v + per_flow) / k for m, v, k in means)
        print(
            f"common to a run's flows: mean {mu:+.3f}, rms beyond the per-flow parts "
            f"{math.sqrt(max(0.0, common)):.3f} over {len(means)} runs"
        )


if __name__ == "__main__":
    main()
