"""What the ETA's mean answer times owe to the floor under the Kaplan-Meier tail, replayed.

`eta.kaplan_meier` never leaves less than one answer in n beyond the longest time seen, and
extends the curve there with a constant-hazard tail: where requests are still in flight, the
slowest of many lives there. A flow with nothing in flight (a dataset the run has not reached,
resting on a pilot's answers alone) gets the same floor, and its mean then exceeds the plain
mean of its answers, which is unbiased, by a share of about 1/n of the tail's mean (3% on a
30-answer pilot of skewed times). This bench replays kept runs (`bench/eta_replay.py`) twice:
as regen computes the ETA, and with such flows' mean set to the plain mean of their answers
(the tail kept for their drain). Nothing in regen is changed by it.

Run: PYTHONPATH=src .venv/bin/python bench/km_floor.py DIR/*-load0            (at 10% and 50%)
     PYTHONPATH=src .venv/bin/python bench/km_floor.py DIR/realistic-* --checks FILE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

import eta_replay

from regen.engine import eta

FLOORED = eta.kaplan_meier


def plain_when_nothing_in_flight(
    done: Sequence[float], censored: Iterable[float], censored_weight: float = 1.0
) -> eta.LatencyModel | None:
    """`eta.kaplan_meier`, with the mean of a flow that has nothing in flight its answers'
    plain mean."""
    running = list(censored)
    model = FLOORED(done, running, censored_weight)
    if model is None or running:
        return model
    return dataclasses.replace(model, mean=sum(done) / len(done), extrapolated=0.0)


def checks(dirs: list[Path], live: Path | None) -> list[tuple[str, str, float, bool]]:
    """(run, point, error, inside its interval) for each replayed check."""
    out = []
    for d in dirs:
        at = eta_replay.live_checks(d, live)
        r = eta_replay.replay(d, [] if live else [0.1, 0.5], [t for t, _ in at.values()])
        labels = {f"{t - r['started']:.0f} s": label for label, (t, _) in at.items()}
        for point, (e, left, _) in r["at"].items():
            error = e.seconds / left - 1
            out.append((d.name, labels.get(point, point), error, e.p10 <= left <= e.p90))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--checks", type=Path, help="bench/realistic.py's --json: its checks' times")
    args = ap.parse_args()
    rows = {}
    for name, km in (("floored (regen)", FLOORED), ("plain", plain_when_nothing_in_flight)):
        eta.kaplan_meier = km
        rows[name] = checks(args.dirs, args.checks)
    eta.kaplan_meier = FLOORED
    print("| run | point | error, floored | in | error, plain | in |")
    print("|---|---|---|---|---|---|")
    for (run, point, e0, in0), (_, _, e1, in1) in zip(*rows.values(), strict=True):
        print(
            f"| {run} | {point} | {e0:+.1%} | {'yes' if in0 else 'no'} | {e1:+.1%} | "
            f"{'yes' if in1 else 'no'} |"
        )
    for name, found in rows.items():
        errors = [e for _, _, e, _ in found]
        print(
            f"{name}: {len(errors)} checks, mean error {statistics.mean(errors):+.1%}, mean abs "
            f"{statistics.mean(map(abs, errors)):.1%}, within 20% "
            f"{sum(abs(e) <= 0.2 for e in errors)}, inside {sum(i for *_, i in found)}"
        )


if __name__ == "__main__":
    main()
