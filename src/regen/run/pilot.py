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

A job whose dollar cap (or the account's credit) is expected to run out first also measures
the items it leaves unsent: that count is the room less the dollars of the items before the
cut, over the dollars of each item at the cut, so a few percent on a dataset's dollars per item
is many items (a cap at 70% of the cost leaves about 30% of the items, and the total's error
comes back three times over in that count). The plan plays the run's order with each
dataset's dollars moved by their error (forecast's `unsent_sd`); the count's error is theirs
added up, and each dataset gets items as its weight in that count times its spread says (the
same allocation, with the items to come replaced by how far a dataset's mean moves the count:
nothing for a dataset after the cut, the most for the one at it). A need worked out from a
round's few answers may be far off, so a dataset grows at most GROWTH times a round.

Every pilot has bounds (`Bounds`), a small share of the job by default: it stops sending when
its time is up (requests in flight get a tenth of it to finish), it spends at most SHARE of the
job's dollar cap (without a cap: of the job's expected cost, once the first round has measured
it; that first round sends half of SHARE of each dataset's items, MIN_FIRST at least, so a
random sample of them costs about half the bound), and it uses at most SHARE of each
dataset's token budget; the dataset stops there and the
pilot says so. Its last line says which bound ended it and what it left wider than asked.

Answers the time bound cuts off still running are not thrown away: each is kept with how long
it ran (state's `cut_short`), a time its answer would have taken at least. A lane's time then
counts them as the ETA does (Kaplan-Meier, censored at that time: forecast.censored_factor),
less sure by as much as they add, and the pilot says per lane how many of its times are
censored, the least its time per answer can be, and whether that pinned it down.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from regen.config import DatasetConfig, Job
from regen.engine.eta import Z90, Stat, format_duration, kaplan_meier
from regen.run.forecast import by_lane, censored_factor
from regen.state.db import Store
from regen.state.work import DatasetProgress

log = logging.getLogger(__name__)

FIRST = 30
"""Items per dataset in the first round."""
MIN_FIRST = 10
"""The fewest items per dataset a first round sends when its money bound is not known yet."""
ROUNDS = 6
"""Rounds at most: sizes grow by at least half each round, so this is rarely reached."""
MARGIN = 1.2
"""More than the spread says is needed: the spread itself is measured on a sample."""
GROWTH = 8
"""A dataset's items grow at most this many times a round."""
HINT_ABOVE = 0.15
"""A fixed-size pilot that leaves a total wider than this at p10-p90 gets a note on sizing it."""
SHARE = 0.05
"""By default a pilot spends at most this share of the job's dollar cap (or expected cost) and
of each dataset's token budget: enough to measure, little of what the run needs."""
TIME_S = 600.0
"""By default a pilot ends within 10 minutes: a wait the user sees, not hours."""
GRACE_SHARE = 0.1
"""The share of the pilot's time kept for requests in flight once sending stops."""
TIME_UP = "pilot time limit"
"""The stop reason of a round stopped by the pilot's time bound."""
UNSENT = "items the cap leaves"
"""The quantity a job whose cap (or credit) runs out first also measures."""
UNSENT_FLOOR = 0.02
"""The items a cap leaves are measured against at least this share of the items to come: a
count of a few items is known well enough to within a few."""

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
    total: float = 0.0
    """The quantity's expected sum over the items to come (for UNSENT, the count)."""


@dataclass(frozen=True)
class Bounds:
    """What a whole pilot may use: seconds, dollars (None: SHARE of the job's cap or, without
    one, of its expected cost), and the share of each dataset's token budget."""

    time_s: float = TIME_S
    usd: float | None = None
    share: float = SHARE
    worst_usd: float | None = None
    """What admission reserves for one request of the job's first lanes (None: no price):
    a money bound that fits fewer of them than `at_once` sends fewer at once."""
    at_once: int = 0
    """The requests those lanes keep on the wire."""


@dataclass(frozen=True)
class Limits:
    """What one round may use: sending stops at `stop_at` (time.monotonic) and requests in
    flight get `grace_s`; the job's spending stops at `total_usd` (None: the job's own cap);
    `token_budgets`: the budgeted datasets' budgets for the round (tokens counted as the job
    counts them, earlier runs' included)."""

    stop_at: float
    grace_s: float
    total_usd: float | None
    token_budgets: dict[str, int]


@dataclass
class Sent:
    """How a round ended: the run's stop reason (None: it sent what it was asked) and whether
    a dollar cap stopped it."""

    stop_reason: str | None
    cap: bool = False


@dataclass(frozen=True)
class LaneCut:
    """A lane's times as the pilot left them: its answers, and the answers cut off still
    running (times known only as lower bounds)."""

    lane: str
    answers: int
    cut: tuple[float, ...]
    """How long each answer cut off had run."""
    at_least_s: float
    """The mean time per answer with each cut-off one at its time so far: a lower bound."""
    estimate_s: float | None
    """The mean from the Kaplan-Meier curve with them censored (None: no answer finished)."""


@dataclass(frozen=True)
class CapLeaves:
    """What the plan, as the pilot stands, says the job's dollar cap (or the account's credit)
    leaves unsent: the items, and per dataset the standard deviation its dollars per item put
    on that count (forecast's `unsent_sd`)."""

    items: float
    sd: Mapping[str, float]


@dataclass
class Outcome:
    """The quantities as last measured and the pilot's closing lines."""

    quantities: list[Quantity]
    notes: list[str]


def bounded(job: Job, limits: Limits) -> Job:
    """The job as one round of the pilot sends it: its dollar cap, token budgets and stop grace
    lowered to the round's limits (the general budget mechanism then enforces them)."""
    grace = min(job.run.stop_grace_s, limits.grace_s)
    datasets: list[DatasetConfig] = [
        d.model_copy(update={"token_budget": limits.token_budgets[d.name]})
        if d.name in limits.token_budgets
        else d
        for d in job.datasets
    ]
    update: dict[str, object] = {
        "run": job.run.model_copy(update={"stop_grace_s": grace}),
        "datasets": datasets,
    }
    if limits.total_usd is not None:
        cap = job.budget.max_cost_usd
        total = limits.total_usd if cap is None else min(cap, limits.total_usd)
        update["budget"] = job.budget.model_copy(update={"max_cost_usd": total})
    return job.model_copy(update=update)


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
    total = var = 0.0
    weight: dict[str, float] = {}
    for ds, n in to_come.items():
        xs = _values(samples.get(ds, ()), name)
        if n <= 0 or len(xs) < 2:
            continue
        s = Stat.of(xs)
        total += n * s.mean
        var += (n * s.se) ** 2
        weight[ds] = n * s.se * math.sqrt(s.n)  # items to come x the per-item spread
    if total <= 0:
        return Quantity(name, None, {}, total)
    error = Z90 * math.sqrt(var) / total
    needs = _neyman(weight, precision * total) if error > precision else {}
    return Quantity(name, error, needs, total)


def _neyman(weight: Mapping[str, float], half_width: float) -> dict[str, int]:
    """Items per dataset that bring a sum's p10-p90 half-width within `half_width` with the
    fewest items (Neyman allocation), MARGIN more: n_ds = w_ds sum_k(w_k) / allowed variance,
    where w is how far a dataset's mean moves the sum times its per-item spread."""
    allowed = (half_width / Z90) ** 2
    spread = sum(weight.values())
    return {ds: math.ceil(w * spread / allowed * MARGIN) for ds, w in weight.items()}


def unsent_quantity(
    leaves: CapLeaves, done: Mapping[str, int], to_come: Mapping[str, int], precision: float
) -> Quantity:
    """The items the cap leaves as a quantity: how far the count may be off (p10-p90, over the
    count or UNSENT_FLOOR of the items to come, whichever is more), and the items per dataset
    that would bring it within `precision`. The count moves with each dataset's mean dollars
    per item by a weight the played ending gives (`sd` at the items measured now, so weight x
    spread per item = sd x sqrt(items)); the same Neyman allocation as a total's, with those
    weights for the items to come: a dataset after the cut gets none, the cut's own the most."""
    scale = max(leaves.items, UNSENT_FLOOR * sum(to_come.values()))
    if scale <= 0:
        return Quantity(UNSENT, None, {}, leaves.items)
    sds = {ds: sd for ds, sd in leaves.sd.items() if sd > 0 and ds in done}
    error = Z90 * math.sqrt(sum(sd * sd for sd in sds.values())) / scale
    weight = {ds: sd * math.sqrt(max(1, done[ds])) for ds, sd in sds.items()}
    needs = _neyman(weight, precision * scale) if error > precision else {}
    return Quantity(UNSENT, error, needs, leaves.items)


def next_sizes(
    quantities: Sequence[Quantity], done: Mapping[str, int], left: Mapping[str, int], most: int
) -> dict[str, int]:
    """Finished items each dataset should have after the next round, for the datasets that
    need more: what the quantities ask (the most of them), at least half as many again as it
    has, at most GROWTH times as many (a need worked out from a round's few answers may be far
    off: the next round's answers say again), never more than `most` nor than it has items."""
    out: dict[str, int] = {}
    for ds, have in done.items():
        asked = max((q.needs.get(ds, 0) for q in quantities), default=0)
        if asked <= have or have >= most or left.get(ds, 0) <= 0:
            continue
        step = min(asked, GROWTH * max(have, 1))
        out[ds] = min(most, have + left[ds], max(step, math.ceil(have * 1.5)))
    return out


def run_pilot(
    job: Job,
    store: Store,
    most: int,
    precision: float | None,
    send: Callable[[dict[str, int], Limits], Sent],
    bounds: Bounds | None = None,
    leaves: Callable[[], CapLeaves | None] | None = None,
) -> Outcome:
    """Send the pilot through `send` (finished items per dataset to reach, and the round's
    limits; it says how the round ended): `most` per dataset at once, or, with `precision`, in
    rounds as the module says, within `bounds`. `leaves`: what the plan says the job's cap
    leaves unsent as things stand (None: it is expected to last), a quantity measured too.
    Says its bounds and each round; returns the quantities as last measured and its closing
    lines. Its bounds and rounds are said as events (`regen/events.py`)."""
    bounds = bounds or Bounds()
    start = time.monotonic()
    grace = bounds.time_s * GRACE_SHARE
    first = {p.name: p for p in store.work.dataset_progress()}
    spent0 = sum(p.cost_usd for p in first.values())
    tokens = _token_limits(job, first, bounds.share)
    usd, usd_from = _money(job, bounds)
    want = _first_want(job, first, most, precision, usd is None, bounds.share)
    log.info(_bounds_line(bounds, usd, usd_from, tokens, want if usd is None else None))
    _say_narrow(bounds, usd)
    quantities: list[Quantity] = []
    notes: list[str] = []
    before: dict[str, int] = {}
    grow: dict[str, int] = {}
    stuck: set[str] = set()
    for round_no in range(1, ROUNDS + 1):
        limits = Limits(
            start + bounds.time_s - grace, grace, None if usd is None else spent0 + usd, tokens
        )
        sent = send(dict(want), limits)
        progress, to_come, quantities, cuts = _measure(job, store, want, precision, leaves)
        spent = sum(p.cost_usd for p in progress.values())
        if usd is None:  # no cap: a share of the expected cost, once a round has measured it
            usd, usd_from = _share_of_expected(bounds, spent, quantities)
        done = {ds: p.done + p.failed for ds, p in progress.items()}
        met = _budgets_met(job, progress, want, tokens, notes)
        ended = _bound_reached(
            sent, start if precision else None, bounds, spent - spent0, usd, usd_from
        )
        if precision is None or (sent.stop_reason and not ended) or ended:
            notes += _closing(quantities, precision, ended) + cut_lines(cuts, quantities, precision)
            return Outcome(quantities, notes)
        # A dataset asked for more that finished nothing more (its budget is met, its items
        # wait on earlier turns) would finish nothing the next round: it is not asked again.
        stuck |= met | {ds for ds in grow if done.get(ds, 0) <= before.get(ds, 0)}
        before = done
        grow = _grow(quantities, done, to_come, most, stuck)
        log.info(_round_line(round_no, done, quantities, precision, grow, stuck, most))
        if not grow:
            break
        want.update(grow)
    notes += _closing(quantities, precision, None) + cut_lines(cuts, quantities, precision)
    return Outcome(quantities, notes)


def _first_want(
    job: Job,
    first: Mapping[str, DatasetProgress],
    most: int,
    precision: float | None,
    no_money_bound: bool,
    share: float,
) -> dict[str, int]:
    """Finished items per dataset the first round asks: `most`, or with `precision` FIRST at
    most, fewer when the money bound is not known yet."""
    want = {d.name: most if precision is None else min(most, FIRST) for d in job.datasets}
    if precision is not None and no_money_bound:
        want = _first_round(want, first, share)
    return want


def _measure(
    job: Job,
    store: Store,
    want: Mapping[str, int],
    precision: float | None,
    leaves: Callable[[], CapLeaves | None] | None = None,
) -> tuple[dict[str, DatasetProgress], dict[str, int], list[Quantity], list[LaneCut]]:
    """After a round: the piloted datasets' progress, their items to come, the quantities
    (time, per lane when there are several, cost, and the items the cap leaves when `leaves`
    says it binds) with their errors as measured now, and each lane's answers cut off still
    running. A lane's time counts those (`censored`)."""
    lanes = [lane.name for lane in job.lane_list]
    progress = {p.name: p for p in store.work.dataset_progress() if p.name in want}
    samples = store.spend.item_totals()
    to_come = {ds: p.pending for ds, p in progress.items()}
    cut = by_lane(store.outstanding.cut_short())
    times = {lane: store.spend.answer_latencies(lane) for lane in lanes}
    cuts = [lane_cut(lane, times[lane], cut.get(lane, [])) for lane in lanes]
    several = len(lanes) > 1
    quantities = []
    for name in [f"time in lane {lane}" for lane in lanes] if several else ["time"]:
        q = quantity(name, samples, to_come, precision or 1.0)
        of = [lane for lane in lanes if name in ("time", f"time in lane {lane}")]
        done = [t for lane in of for t in times[lane]]
        late = [t for lane in of for t in cut.get(lane, [])]
        quantities.append(censored(q, censored_factor(done, late)))
    quantities.append(quantity("cost", samples, to_come, precision or 1.0))
    cap_leaves = leaves() if leaves is not None else None
    if cap_leaves is not None:
        items = {ds: p.done + p.failed for ds, p in progress.items()}
        quantities.append(unsent_quantity(cap_leaves, items, to_come, precision or 1.0))
    return progress, to_come, quantities, [c for c in cuts if c.cut]


def censored(q: Quantity, factor: float) -> Quantity:
    """A time lengthened by `factor` for the answers cut off still running (censored_factor):
    its total grows by as much, and what it adds rests on times never seen to their end, so
    its error grows by the share added (as forecast.censored_stat has it)."""
    if factor <= 1.0 or q.error is None:
        return q
    error = math.hypot(q.error, Z90 * (factor - 1.0) / factor)
    return Quantity(q.name, error, q.needs, q.total * factor)


def lane_cut(lane: str, done: Sequence[float], cut: Sequence[float]) -> LaneCut:
    """A lane's answers and its answers cut off still running, with its time per answer:
    at least (every cut-off one at its time so far) and as the Kaplan-Meier curve has it."""
    every = [*done, *cut]
    at_least = sum(every) / len(every) if every else 0.0
    model = kaplan_meier(done, cut) if done else None
    return LaneCut(lane, len(done), tuple(cut), at_least, model.mean if model else None)


def _grow(
    quantities: Sequence[Quantity],
    done: Mapping[str, int],
    to_come: Mapping[str, int],
    most: int,
    stuck: set[str],
) -> dict[str, int]:
    """The next round's sizes for the datasets that need more, but none that is stuck."""
    return {
        ds: n for ds, n in next_sizes(quantities, done, to_come, most).items() if ds not in stuck
    }


def _round_line(
    round_no: int,
    done: Mapping[str, int],
    quantities: Sequence[Quantity],
    precision: float,
    grow: Mapping[str, int],
    stuck: set[str],
    most: int,
) -> str:
    """What a round says: items finished, each quantity's error, and what comes next (or why
    the pilot stops there)."""
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
    return line


def _first_round(
    want: Mapping[str, int], progress: Mapping[str, DatasetProgress], share: float
) -> dict[str, int]:
    """A first round whose money bound is not known yet (no cap, no --pilot-usd): a random
    sample of half the share of each dataset's items costs about half the share of the
    expected cost, leaving the later rounds, bounded, the rest (MIN_FIRST at least)."""
    out = {}
    for ds, n in want.items():
        p = progress.get(ds)
        items = p.pending + p.done + p.failed if p is not None else 0
        out[ds] = min(n, max(MIN_FIRST, math.ceil(share / 2 * items)))
    return out


def _used(job: Job, p: DatasetProgress) -> int:
    """A dataset's tokens as its token budget counts them."""
    total = job.budget.budget_tokens == "total"
    return p.completion_tokens + (p.prompt_tokens if total else 0)


def _token_limits(
    job: Job, progress: Mapping[str, DatasetProgress], share: float
) -> dict[str, int]:
    """Each budgeted dataset's budget for the pilot: what it used before plus `share` of its
    budget, never beyond the budget."""
    out: dict[str, int] = {}
    for d in job.datasets:
        if d.token_budget is None or d.name not in progress:
            continue
        room = max(1, math.floor(share * d.token_budget))
        out[d.name] = min(d.token_budget, _used(job, progress[d.name]) + room)
    return out


def _money(job: Job, bounds: Bounds) -> tuple[float | None, str]:
    """The pilot's dollars and where they come from (None: not known before a first round)."""
    if bounds.usd is not None:
        return bounds.usd, "--pilot-usd"
    cap = job.budget.max_cost_usd
    if cap is not None:
        return bounds.share * cap, "the job's dollar cap"
    return None, "the expected cost"


def _bounds_line(
    bounds: Bounds,
    usd: float | None,
    usd_from: str,
    tokens: Mapping[str, int],
    first: Mapping[str, int] | None = None,
) -> str:
    """The pilot's first line; `first`: the first round's items when its money bound is not
    known before it (that round is bounded by its size)."""
    money = (
        f"${usd:.4f}"
        + ("" if usd_from == "--pilot-usd" else f" ({bounds.share:.0%} of {usd_from})")
        if usd is not None
        else f"{bounds.share:.0%} of the expected cost (after the first round"
        + (
            f", which sends at most {max(first.values())} items per dataset, about half that "
            "share of each"
            if first
            else ""
        )
        + ")"
    )
    line = f"pilot bounds: {format_duration(bounds.time_s)}, {money}"
    if tokens:
        line += f", {bounds.share:.0%} of each dataset's token budget"
    return line + " (--pilot-time, --pilot-usd, --pilot-share)"


def _share_of_expected(
    bounds: Bounds, spent: float, quantities: Sequence[Quantity]
) -> tuple[float, str]:
    """An uncapped pilot's money bound once a round has measured the expected cost: its share
    of that (said when it fits fewer requests than the lanes keep on the wire)."""
    cost = next(q.total for q in quantities if q.name == "cost")
    usd = bounds.share * (spent + cost)
    _say_narrow(bounds, usd)
    return usd, "the expected cost"


def _say_narrow(bounds: Bounds, usd: float | None) -> None:
    """Say when the money bound fits fewer requests at their worst case than the lanes keep
    on the wire: admission holds each request's worst case against the bound, so the pilot
    sends that few at once and takes longer for each answer it needs."""
    if usd is None or not bounds.worst_usd or bounds.worst_usd <= 0:
        return
    fits = math.floor(usd / bounds.worst_usd)
    if fits < bounds.at_once:
        log.info(
            f"pilot: its money bound (${usd:.4f}) fits {fits} requests at once at their worst "
            f"case (${bounds.worst_usd:.4f} each, max_tokens at the highest price), of the "
            f"{bounds.at_once} the lanes keep on the wire: it sends that few at once "
            "(--pilot-usd or --pilot-share for more)"
        )


def _budgets_met(
    job: Job,
    progress: Mapping[str, DatasetProgress],
    want: Mapping[str, int],
    tokens: Mapping[str, int],
    notes: list[str],
) -> set[str]:
    """Datasets the pilot stopped short of what it asked at their share of a token budget (one
    more answer of max_tokens could pass it); each said once in `notes`."""
    budgets = {d.name: d.token_budget for d in job.datasets}
    met: set[str] = set()
    for ds, limit in tokens.items():
        p = progress.get(ds)
        if p is None or p.pending <= 0 or p.done + p.failed >= want.get(ds, 0):
            continue
        # Stopped by its share only if one more answer could pass it (not cut short by the
        # pilot's time or money with room left).
        most = max(job.lane_max_tokens(lane) for lane in job.lane_list)
        if _used(job, p) + most < limit:
            continue
        met.add(ds)
        line = (
            f"pilot: {ds} stopped at its share of its token budget ({_used(job, p):,} of "
            f"{budgets[ds]:,} tokens used, the pilot's limit {limit:,}; --pilot-share)"
        )
        if line not in notes:
            notes.append(line)
    return met


def _bound_reached(
    sent: Sent,
    start: float | None,
    bounds: Bounds,
    spent: float,
    usd: float | None,
    usd_from: str,
) -> str | None:
    """Which of the pilot's bounds ended it, in words (None: none). `start`: when a pilot in
    rounds started (a bound reached leaves no room for another round); None: only a round the
    bounds stopped counts."""
    late = start is not None and time.monotonic() - start >= bounds.time_s * (1 - GRACE_SHARE)
    if sent.stop_reason == TIME_UP or late:
        return f"its time bound ({format_duration(bounds.time_s)}, --pilot-time)"
    if usd is not None and (sent.cap or (start is not None and spent >= usd)):
        return f"its money bound (${usd:.4f}, from {usd_from}: ${spent:.4f} spent; --pilot-usd)"
    return None


def _closing(
    quantities: Sequence[Quantity], precision: float | None, ended: str | None
) -> list[str]:
    """The pilot's last lines: which bound ended it, what it left wider than asked, and, when
    its time ran out, that the answers it cut off (the longest) are missing from its figures."""
    if precision is None:
        out = [f"pilot: stopped at {ended}"] if ended else []
    else:
        wide = [q for q in quantities if q.error is None or q.error > precision]
        if not wide:
            out = [
                f"pilot: every total within {_pm(precision)}"
                + (f"; ended at {ended}" if ended else "")
            ]
        else:
            rest = ", ".join(f"{q.name} {_pm(q.error)}" for q in wide)
            why = f"it stopped at {ended}" if ended else "it ran out of rounds, items or --pilot N"
            out = [f"pilot: not pinned down to {_pm(precision)}: {rest}; {why}"]
    if ended is not None and ended.startswith("its time bound"):
        # Cut off at a time, the answers still running are the long ones: what finished leans
        # short, by more than the spreads above say (bench/plan.py: cost -30% on `skewed`).
        out.append(
            "note: the pilot's time ran out with answers still running, the longest ones: its "
            "costs lean low (their times count, as at least as long as they ran); a larger "
            "--pilot-time measures them"
        )
    return out


def cut_lines(
    cuts: Sequence[LaneCut], quantities: Sequence[Quantity], precision: float | None
) -> list[str]:
    """Per lane with answers cut off still running: how many of its times are censored, the
    least its time per answer can be, the estimate with a fitted tail, and whether that
    pins it down (its time's error within `precision`)."""
    out = []
    errors = {q.name.removeprefix("time in lane "): q.error for q in quantities}
    for c in cuts:
        error = errors.get(c.lane, errors.get("time"))
        pinned = precision is not None and error is not None and error <= precision
        line = (
            f"pilot: lane {c.lane}: {c.answers} answers, {len(c.cut)} more still running when "
            f"cut off (after {_span(c.cut)}): its time per answer is at least "
            f"{format_duration(c.at_least_s)}"
        )
        if c.estimate_s is not None:
            line += f", about {format_duration(c.estimate_s)} with a fitted tail"
        line += f" ({_pm(error)}), pinned down" if pinned else f" ({_pm(error)}), not pinned down"
        out.append(line)
    return out


def _span(xs: Sequence[float]) -> str:
    low, high = min(xs), max(xs)
    if format_duration(low) == format_duration(high):
        return format_duration(high)
    return f"{format_duration(low)} to {format_duration(high)}"


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
