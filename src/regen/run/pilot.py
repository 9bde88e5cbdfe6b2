"""A pilot sized by what it must measure: `regen plan --pilot N --precision P`.

A dataset the run has not reached yet is known only through its pilot: its answers are what the
plan, and the run's ETA until the run gets there, rest on. A fixed 30 items per dataset says
little when answers vary much: where half a dataset's items go on to a long lane and take 4,000
tokens there, the long lane's time per item measured on 30 of them is off by a fifth or more
about two times in five. So the pilot goes in rounds: 30 items per dataset first; then, for
each quantity the plan sums (each lane's time on the wire, the job's cost) whose total over the
items still to come is not yet known within +/-P at p10-p90, more items, shared among the
datasets as stratified sampling does (Neyman allocation: a dataset gets items in proportion to
its items to come times the spread of its items' values, which makes the total's error smallest
for the items sent); until every total is known, every dataset has N items, or none has items
left.

A total's error is the root of the sum over datasets of (items to come x the standard error of
the mean per item)^2, the latter from Stat.of (Cox's for skewed quantities, which a small
sample's own spread understates). The items a pilot sends are kept for the run: a larger pilot
costs time before the run starts, not money beyond the job's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console

from regen.config import Job
from regen.engine.eta import Z90, Stat
from regen.state.db import Store

FIRST = 30
"""Items per dataset in the first round."""
ROUNDS = 6
"""Rounds at most: sizes grow by at least half each round, so this is rarely reached."""
MARGIN = 1.2
"""More than the spread says is needed: the spread itself is measured on a sample."""
HINT_ABOVE = 0.15
"""A fixed-size pilot that leaves a total wider than this at p10-p90 gets a note on sizing it."""

Totals = Sequence[tuple[Mapping[str, float], float]]
"""A dataset's finished items: (time on the wire per lane, dollars charged)."""


@dataclass(frozen=True)
class Quantity:
    """One total the plan sums over the items to come (a lane's time, the job's cost): how
    far it may be off (p10-p90 half-width over the total; None: too few items to say), and
    the items each dataset needs for it to be known within the precision asked."""

    name: str
    error: float | None
    needs: dict[str, int]


def _values(totals: Totals, name: str) -> list[float]:
    if name == "cost":
        return [usd for _, usd in totals]
    if name == "time":  # one lane: wherever the attempts were recorded
        return [sum(wire.values()) for wire, _ in totals]
    return [wire.get(name.removeprefix("time in lane "), 0.0) for wire, _ in totals]


def quantity(
    name: str, samples: Mapping[str, Totals], to_come: Mapping[str, int], precision: float
) -> Quantity:
    """`name` ("cost", "time" or "time in lane L") summed over the items to come: its error
    now, and the items per dataset that would bring it within `precision` (Neyman
    allocation)."""
    total = var = spread = 0.0
    stats: dict[str, Stat] = {}
    for ds, n in to_come.items():
        xs = _values(samples.get(ds, ()), name)
        if n <= 0 or len(xs) < 2:
            continue
        stats[ds] = s = Stat.of(xs)
        total += n * s.mean
        var += (n * s.se) ** 2
        spread += n * s.se * math.sqrt(s.n)
    if total <= 0:
        return Quantity(name, None, {})
    error = Z90 * math.sqrt(var) / total
    needs: dict[str, int] = {}
    if error > precision:
        allowed = (precision * total / Z90) ** 2
        for ds, s in stats.items():
            # n_ds = N_ds sd_ds sum_k(N_k sd_k) / allowed variance, sd the per-item spread.
            needs[ds] = math.ceil(to_come[ds] * s.se * math.sqrt(s.n) * spread / allowed * MARGIN)
    return Quantity(name, error, needs)


def next_sizes(
    quantities: Sequence[Quantity], done: Mapping[str, int], left: Mapping[str, int], most: int
) -> dict[str, int]:
    """Finished items each dataset should have after the next round, for the datasets that
    need more: what the quantities ask (the most of them), at least half as many again as it
    has, never more than `most` nor than it has items."""
    out: dict[str, int] = {}
    for ds, have in done.items():
        asked = max((q.needs.get(ds, 0) for q in quantities), default=0)
        if asked <= have or have >= most or left.get(ds, 0) <= 0:
            continue
        out[ds] = min(most, have + left[ds], max(asked, math.ceil(have * 1.5)))
    return out


def run_pilot(
    job: Job,
    store: Store,
    console: Console,
    most: int,
    precision: float | None,
    send: Callable[[dict[str, int]], str | None],
) -> list[Quantity]:
    """Send the pilot through `send` (finished items per dataset to reach; it returns why the
    pilot stopped early, if it did): `most` per dataset at once, or, with `precision`, in
    rounds as the module says. Says each round; returns the quantities as last measured."""
    names = [d.name for d in job.datasets]
    lanes = [lane.name for lane in job.lane_list]
    want = {ds: most if precision is None else min(most, FIRST) for ds in names}
    quantities: list[Quantity] = []
    before: dict[str, int] = {}
    grow: dict[str, int] = {}
    stuck: set[str] = set()
    for round_no in range(1, ROUNDS + 1):
        stopped = send(dict(want))
        progress = {p.name: p for p in store.work.dataset_progress() if p.name in want}
        samples = store.spend.item_totals()
        to_come = {ds: p.pending for ds, p in progress.items()}
        names_q = [f"time in lane {lane}" for lane in lanes] if len(lanes) > 1 else ["time"]
        quantities = [quantity(q, samples, to_come, precision or 1.0) for q in (*names_q, "cost")]
        if precision is None or stopped:
            return quantities
        done = {ds: p.done + p.failed for ds, p in progress.items()}
        # A dataset asked for more that finished nothing more (its budget is met, its items
        # wait on earlier turns) would finish nothing the next round: it is not asked again.
        stuck |= {ds for ds in grow if done.get(ds, 0) <= before.get(ds, 0)}
        before = done
        grow = {
            ds: n
            for ds, n in next_sizes(quantities, done, to_come, most).items()
            if ds not in stuck
        }
        errors = ", ".join(f"{q.name} {_pm(q.error)}" for q in quantities)
        sizes = ", ".join(f"{ds} {n}" for ds, n in done.items())
        line = f"pilot round {round_no}: {sizes} items; {errors} (asked {_pm(precision)})"
        if grow and round_no < ROUNDS:
            line += "; next: " + ", ".join(f"{ds} to {n}" for ds, n in grow.items())
        elif grow:
            line += f"; stops there ({ROUNDS} rounds)"
        elif any((q.error or 0.0) > precision for q in quantities):
            why = f"--pilot {most} per dataset, or no items left"
            if stuck:
                why += f"; nothing more finished in {', '.join(sorted(stuck))} (a budget met?)"
            line += f"; stops there ({why})"
        console.print(line, markup=False, highlight=False)
        if not grow:
            break
        want.update(grow)
    return quantities


def pilot_lines(quantities: Sequence[Quantity], precision: float | None) -> list[str]:
    """How well the pilot measured what the plan sums, and, when a fixed-size pilot left any
    of it wider than +/-HINT_ABOVE, how to size it: the figures that rest on it are only as
    good (and the run's ETA, until it reaches each dataset)."""
    known = [q for q in quantities if q.error is not None]
    if not known:
        return []
    lines = ["pilot measured: " + ", ".join(f"{q.name} {_pm(q.error)}" for q in known)]
    widest = max(known, key=lambda q: q.error or 0.0)
    if precision is None and (widest.error or 0.0) > HINT_ABOVE:
        lines.append(
            f"note: the pilot leaves {widest.name} {_pm(widest.error)} at p10-p90: "
            "`regen plan --pilot 500 --precision 0.1` sends more items where they narrow it "
            "(kept for the run)"
        )
    return lines


def _pm(x: float | None) -> str:
    return "?" if x is None else f"+/-{x:.0%}"
