"""How a job ends under its dollar cap (or the account's credit): the run's order, played out.

A run does not spend a dataset at a time. Each lane hands out its items by rank: items
escalated to it first (their first try is paid and cut short), then its own datasets in the
job's order; lanes run side by side, and a truncated answer in one lane joins the backlog of
the lane it escalates to once it is committed. When the dollars committed reach the room left,
admission stops on every lane at once, and what is pending then stays pending: the lanes' own
items not yet handed out, the escalated items waiting in a backlog (paid once, never answered),
and the escalations of the passages still in flight.

`play` runs that order as a fluid: each lane spends its time (its seconds per passage, the
slower of its workers and what it may keep on the wire) on its backlog, mixed as it arrived,
then on its datasets in order; a passage commits its expected dollars when it starts, as
admission reserves them, and its escalated share arrives in the next lane's backlog a passage
time later.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

STEPS = 2000
"""Time steps over the longest lane's work: fine enough that the order within a step does
not matter (a step is 0.05% of the job)."""


@dataclass(frozen=True, slots=True)
class Flow:
    """One dataset in one lane, per passage."""

    seconds: float
    """Lane time one passage takes: its time held over the workers, or on the wire over what
    the lane may keep there, whichever is slower."""
    cost_usd: float
    escalated: float
    """The share sent on to `escalate_to`."""
    held_s: float
    """From its start to its end, when an escalation joins the next lane's backlog."""


@dataclass(frozen=True)
class Lane:
    """A lane's own items in its hand-out order, and where it escalates."""

    name: str
    own: list[tuple[str, float]]
    """(dataset, items) in the job's order."""
    escalate_to: str | None = None


@dataclass(frozen=True)
class Ending:
    """Where the room runs out: when, and what each dataset leaves pending."""

    at_s: float
    unsent: dict[str, float]
    """Items left pending per dataset: never handed out, or escalated and not answered."""
    escalated: dict[str, float] = field(default_factory=dict)
    """Of those, the escalated ones (their first try paid)."""


@dataclass
class _State:
    own: dict[str, list[list[float | str]]]
    backlog: dict[str, dict[str, float]]
    arrivals: dict[int, list[tuple[str, str, float]]]
    spent: float = 0.0


def play(lanes: list[Lane], flows: dict[tuple[str, str], Flow], room: float) -> Ending | None:
    """Play the lanes' order until `room` dollars are committed: the ending, or None when
    every item is handed out first."""
    work = _work(lanes, flows)
    if work <= 0:
        return None
    dt = work / STEPS
    state = _State(
        {lane.name: [[ds, n] for ds, n in lane.own if n > 0] for lane in lanes},
        {lane.name: defaultdict(float) for lane in lanes},
        defaultdict(list),
    )
    by_name = {lane.name: lane for lane in lanes}
    # Escalations keep arriving after the last own item: run until nothing is left.
    step = 0
    while step < 100 * STEPS:
        for lane_name, ds, n in state.arrivals.pop(step, []):
            state.backlog[lane_name][ds] += n
        for lane in lanes:
            stopped = _serve(lane, by_name, flows, state, step, dt, room)
            if stopped is not None:
                return _ending(state, (step + stopped) * dt)
        step += 1
        if not state.arrivals and not any(state.own.values()) and not _backlog(state):
            return None
    return None


def _work(lanes: list[Lane], flows: dict[tuple[str, str], Flow]) -> float:
    """The longest lane's seconds if its own items were all it had: the time scale."""
    return max(
        (sum(n * flows[lane.name, ds].seconds for ds, n in lane.own) for lane in lanes), default=0.0
    )


def _backlog(state: _State) -> float:
    return sum(n for b in state.backlog.values() for n in b.values())


def _serve(
    lane: Lane,
    lanes: dict[str, Lane],
    flows: dict[tuple[str, str], Flow],
    state: _State,
    step: int,
    dt: float,
    room: float,
) -> float | None:
    """One step of a lane: its backlog, mixed as it arrived, then its datasets in order. The
    share of the step at which the room ran out, or None."""
    left = dt
    backlog = state.backlog[lane.name]
    total = sum(backlog.values())
    if total > 1e-12:
        per = sum(n * flows[lane.name, ds].seconds for ds, n in backlog.items()) / total
        k = min(total, left / per) if per > 0 else total
        chunk = {ds: k * n / total for ds, n in backlog.items()}
        done = _start(lane, lanes, flows, state, step, dt, chunk, room)
        for ds, n in chunk.items():
            backlog[ds] -= n * done
        if done < 1.0:
            return (dt - left + k * per * done) / dt
        left -= k * per
    queue = state.own[lane.name]
    while queue and left > 1e-12:
        ds, n = str(queue[0][0]), float(queue[0][1])
        sec = flows[lane.name, ds].seconds
        k = min(n, left / sec) if sec > 0 else n
        done = _start(lane, lanes, flows, state, step, dt, {ds: k}, room)
        queue[0][1] = n - k * done
        if done < 1.0:
            return (dt - left + k * sec * done) / dt
        left -= k * sec
        if n - k <= 1e-9:
            queue.pop(0)
    return None


def _start(
    lane: Lane,
    lanes: dict[str, Lane],
    flows: dict[tuple[str, str], Flow],
    state: _State,
    step: int,
    dt: float,
    chunk: dict[str, float],
    room: float,
) -> float:
    """Start a chunk of passages: their dollars are committed, their escalations scheduled.
    The share of the chunk the room let start (1.0: all of it)."""
    usd = sum(n * flows[lane.name, ds].cost_usd for ds, n in chunk.items())
    share = 1.0
    if usd > 0 and state.spent + usd >= room:
        share = max(0.0, (room - state.spent) / usd)
    state.spent += usd * share
    target = lane.escalate_to if lane.escalate_to in lanes else None
    for ds, n in chunk.items():
        f = flows[lane.name, ds]
        if target is not None and f.escalated > 0:
            at = step + 1 + int(f.held_s / dt)
            state.arrivals[at].append((target, ds, n * share * f.escalated))
    return share


def _ending(state: _State, at_s: float) -> Ending:
    """What stays pending once admission stops: own items, backlogs, and the escalations of
    the passages in flight (they arrive after the stop)."""
    unsent: dict[str, float] = defaultdict(float)
    escalated: dict[str, float] = defaultdict(float)
    for queue in state.own.values():
        for ds, n in queue:
            unsent[str(ds)] += float(n)
    for backlog in state.backlog.values():
        for ds, n in backlog.items():
            unsent[ds] += n
            escalated[ds] += n
    for arriving in state.arrivals.values():
        for _, ds, n in arriving:
            unsent[ds] += n
            escalated[ds] += n
    return Ending(at_s, dict(unsent), dict(escalated))
