"""How well a pilot of its size can know a lane's time at all: the floor under an ETA that rests
on a pilot until the run reaches each dataset.

For each kept job (`bench/realistic.py --keep DIR`, `bench/plan.py --keep DIR`, or any job
directory with `out/state.db` that had a pilot and a run) and each lane: the time its datasets
took in the run (their answers' times on the wire, summed), against the same answers priced at
the pilot's mean time per answer of each dataset, as an ETA resting on the pilot alone prices
them. The first dataset of the lane is left out (by 10% of the items the run has measured it).
The error that draws alone give: pilots of the same sizes (or `--scale` times them) drawn from
the run's own answers (with replacement, `--draws` times): their sd, and how often they are
off by over 20% and 15%. Nothing here depends on the ETA's code: what a mean of n answers can
say about a mean of the many.

Run: .venv/bin/python bench/pilot_floor.py DIR/realistic-* [--lane long] [--scale 1.5]
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from pilot_drift import answers


def flows(job: Path, lane: str) -> list[tuple[str, list[float], list[float]]]:
    """(dataset, the pilot's times, the run's times) of the lane's datasets, in the order of
    their first answer in the run."""
    found = [
        (ds, [t for _, t, _ in pilot], [t for _, t, _ in run], run[0][0])
        for (name, ds), (pilot, run) in answers(job).items()
        if name == lane and run
    ]
    return [(ds, pilot, run) for ds, pilot, run, _ in sorted(found, key=lambda f: f[3])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jobs", type=Path, nargs="+")
    ap.add_argument("--lane", default="long")
    ap.add_argument("--scale", type=float, default=1.0, help="pilot sizes times this")
    ap.add_argument("--draws", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(1)
    seen: list[float] = []
    drawn: list[float] = []
    print(f"lane {args.lane}, pilots of {args.scale:g} x their sizes")
    print(
        "| job | datasets | pilot answers | error of the pilot's prices | drawn: sd, >20%, >15% |"
    )
    print("|---|---|---|---|---|")
    for job in args.jobs:
        rest = flows(job, args.lane)[1:]
        if not rest:
            continue
        actual = sum(sum(r) for _, _, r in rest)
        priced = sum(len(r) * statistics.mean(p or r) for _, p, r in rest)
        error = priced / actual - 1
        seen.append(error)
        mine = []
        for _ in range(args.draws):
            est = sum(
                len(r) * statistics.mean(rng.choices(r, k=max(1, round(args.scale * len(p)))))
                if p
                else sum(r)
                for _, p, r in rest
            )
            mine.append(est / actual - 1)
        drawn += mine
        print(
            f"| {job.name} | {len(rest)} | {sum(len(p) for _, p, _ in rest)} | {error:+.1%} | "
            f"{statistics.stdev(mine):.3f}, {share(mine, 0.2):.1%}, {share(mine, 0.15):.1%} |"
        )
    if seen:
        print(
            f"\n{len(seen)} jobs: the pilot's prices off by a mean of {statistics.mean(seen):+.1%}"
            + (f", sd {statistics.stdev(seen):.3f}" if len(seen) > 1 else "")
            + f", over 20% in {sum(abs(e) > 0.2 for e in seen)}; drawn pilots: "
            f"sd {statistics.stdev(drawn):.3f}, over 20% in {share(drawn, 0.2):.1%}, "
            f"over 15% in {share(drawn, 0.15):.1%}"
        )


def share(errors: list[float], beyond: float) -> float:
    return sum(abs(e) > beyond for e in errors) / len(errors)


if __name__ == "__main__":
    main()
