"""Whether the error `Stat.of` gives the mean of a few answers holds: draws of n answers from a
flow's whole run (a kept job's lane and dataset, thousands of answers), each mean's p10-p90 (the
mean -/+ Z90 of its error) set against the whole run's mean; and the same from the modelled
mixture of bench/eta_model.py and from a log-normal. Held about four times in five when the
error is the right size; the rms of (mean - true) / error about 1.

Run: PYTHONPATH=src .venv/bin/python bench/mean_error.py DIR/*-load0 [--sizes 15,30]
"""

from __future__ import annotations

import argparse
import math
import random
import sqlite3
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eta_model  # noqa: E402 - the modelled mixture

from regen.engine.eta import Z90, Stat  # noqa: E402


def held(population: Sequence[float], n: int, rng: random.Random, draws: int = 2000) -> str:
    """How often the p10-p90 of n answers' mean holds the population's, and the rms z."""
    true = statistics.mean(population)
    inside, squares = 0, 0.0
    for _ in range(draws):
        stat = Stat.of(rng.sample(list(population), n))
        z = (stat.mean - true) / stat.se
        inside += abs(z) <= Z90
        squares += z * z
    return f"n={n}: held {inside / draws:.0%}, rms z {math.sqrt(squares / draws):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jobs", type=Path, nargs="*")
    ap.add_argument("--sizes", default="15,30")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = random.Random(1)
    for job in args.jobs:
        db = sqlite3.connect(f"file:{job / 'out' / 'state.db'}?mode=ro", uri=True)
        (started,) = db.execute("SELECT min(started_at) FROM runs WHERE kind = 'run'").fetchone()
        flows: dict[tuple[str, str], list[float]] = {}
        for lane, ds, seconds in db.execute(
            "SELECT a.lane, i.dataset, a.latency_s FROM attempts a "
            "JOIN items i ON i.id = a.item_id "
            "WHERE a.failure_class IS NULL AND a.started_at >= ?",
            (started,),
        ):
            flows.setdefault((lane, ds), []).append(seconds)
        db.close()
        for (lane, ds), times in sorted(flows.items()):
            if len(times) >= 300:
                cells = "; ".join(held(times, n, rng) for n in sizes)
                print(f"{job.name} {lane}/{ds} ({len(times)} answers): {cells}")
    model = [eta_model.latency(rng) for _ in range(20_000)]
    print("bench/eta_model.py's mixture:", "; ".join(held(model, n, rng) for n in sizes))
    lognormal = [rng.lognormvariate(0.0, 0.8) for _ in range(20_000)]
    print("a log-normal, sigma 0.8:", "; ".join(held(lognormal, n, rng) for n in sizes))


if __name__ == "__main__":
    main()
