"""How a job ends under its dollar cap (or the account's credit): the run's order, played out.

A run does not spend a dataset at a time. Each lane hands out its items by rank: items
escalated to it first (their first try is paid and cut short), then its own datasets in the
job's order; lanes run side by side, and a truncated answer in one lane joins the backlog of
the lane it escalates to once it is committed. A dataset's own budget (tokens or dollars) is
used up in that same order: once it is met, its items still waiting, in any lane, stay pending.
When the dollars committed reach the room left, admission stops on every lane at once, and
what is pending then stays pending: the lanes' own items not yet handed out, the escalated
items waiting in a backlog (paid once, never answered), and the escalations of the passages
still in flight.

`play` runs that order as a fluid: each lane spends its time (its seconds per passage, the
slower of its workers and what it may keep on the wire) on its backlog, then on its datasets
in order; a passage commits its expected dollars and tokens when it starts, as admission
reserves them, and its escalated share arrives in the next lane's backlog a passage time
later. A backlog is handed out as the feeder does (`Feeder._feed_escalated`): first escalated,
first out. (The feeder once went over it in passes over the order keys: what the cap left of
it then hung on where the pass stood, and on bench/realistic.py the plan's count was off by
+29% to +85%.)
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace

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
    tokens: float = 0.0
    """What it uses of its dataset's token budget (as the budget counts tokens)."""
    cost_se: float = 0.0
    """How unsure `cost_usd` is (its standard error): the items the cap leaves are the room
    less the dollars of the items before them, over the dollars of each, so a few percent on
    those is many items left (`unsent_range`)."""
    seconds_se: float = 0.0
    """How unsure `seconds` is: a slower lane has more of its backlog waiting at the stop."""
    escalated_sd: float = 0.0
    """How unsure `escalated` is: each share point more is that many more items in the next
    lane's backlog (a share from 20 answers is +/-10 points)."""

    @property
    def unsure(self) -> bool:
        """Whether any of its figures has an error to draw from (`unsent_range`)."""
        return self.cost_se > 0 or self.seconds_se > 0 or self.escalated_sd > 0


@dataclass(frozen=True)
class Lane:
    """A lane's own items in its hand-out order, and where it escalates."""

    name: str
    own: list[tuple[str, float]]
    """(dataset, items) in the job's order."""
    escalate_to: str | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    """What a dataset may still use: tokens and dollars (None: no such budget)."""

    tokens: float | None = None
    usd: float | None = None


@dataclass(frozen=True)
class Ending:
    """Where the room runs out: when, and what each dataset leaves pending."""

    at_s: float
    unsent: dict[str, float]
    """Items the cap leaves pending per dataset: never handed out, or escalated and not
    answered."""
    escalated: dict[str, float] = field(default_factory=dict)
    """Of those, the escalated ones (their first try paid)."""
    met: dict[str, float] = field(default_factory=dict)
    """Items a dataset's own budget leaves pending (met before the cap)."""
    unsent_range: tuple[float, float] | None = None
    """p10 and p90 of the items the cap leaves pending, over the flows' `cost_se`."""
    unsent_sd: dict[str, float] = field(default_factory=dict)
    """Per dataset, the standard deviation its dollars per passage (`cost_se`) put on the
    items the cap leaves pending: where a pilot's next answers narrow that count most."""


@dataclass
class _State:
    own: dict[str, deque[list[float | str]]]
    """Per lane, its own items not handed out yet, (dataset, items) in the job's order."""
    backlog: dict[str, deque[list[float | str]]]
    """Per lane, the escalated items waiting, (dataset, items) in the order they came."""
    arrivals: dict[int, list[tuple[str, str, float]]]
    budgets: dict[str, Budget]
    used: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    """Per dataset: tokens and dollars committed."""
    held: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Items passed over because their dataset's budget is met (own or escalated)."""
    spent: float = 0.0

    def left(self, ds: str, flow: Flow) -> float:
        """Passages of `flow` its dataset's budgets still let start (inf: no budget)."""
        b = self.budgets.get(ds)
        if b is None:
            return math.inf
        tokens, usd = self.used[ds]
        out = math.inf
        if b.tokens is not None and flow.tokens > 0:
            out = min(out, max(0.0, (b.tokens - tokens) / flow.tokens))
        if b.usd is not None and flow.cost_usd > 0:
            out = min(out, max(0.0, (b.usd - usd) / flow.cost_usd))
        return out

    def arrive(self, lane: str, ds: str, n: float) -> None:
        """`n` items of `ds` escalated into `lane`: they wait behind those that came before."""
        queue = self.backlog[lane]
        if queue and queue[-1][0] == ds:
            queue[-1][1] = float(queue[-1][1]) + n
        else:
            queue.append([ds, n])

    def met(self, ds: str) -> bool:
        b = self.budgets.get(ds)
        if b is None:
            return False
        tokens, usd = self.used[ds]
        return (b.tokens is not None and tokens >= b.tokens - 1e-9) or (
            b.usd is not None and usd >= b.usd - 1e-12
        )


def play(
    lanes: list[Lane],
    flows: dict[tuple[str, str], Flow],
    room: float,
    budgets: dict[str, Budget] | None = None,
) -> Ending | None:
    """Play the lanes' order until `room` dollars are committed: the ending, or None when
    every item is handed out (or left to a dataset's own budget) first; with the p10-p90 of
    the items left where the flows' figures are unsure (`Flow.unsure`)."""
    ending = _play(lanes, flows, room, budgets)
    if ending is None or not any(f.unsure for f in flows.values()):
        return ending
    return replace(
        ending,
        unsent_range=unsent_range(lanes, flows, room, budgets),
        unsent_sd=unsent_sd(lanes, flows, room, budgets),
    )


RANGE_DRAWS = 40
"""Plays of the order with each flow's dollars drawn from its error: enough for a p10 and a
p90 to a few items, a fraction of a second on a job of a few lanes and datasets."""


def unsent_range(
    lanes: list[Lane],
    flows: dict[tuple[str, str], Flow],
    room: float,
    budgets: dict[str, Budget] | None = None,
) -> tuple[float, float]:
    """p10 and p90 of the items left pending when each flow's dollars and lane time per
    passage and its share escalated are drawn (seeded) from their means and errors,
    independently: the cap's items left as unsure as the figures that decide them (a pilot's
    few answers of a dataset). The dollars decide when the room runs out; the shares and the
    times, how much of a long lane's backlog is still waiting then (bench/realistic.py: with
    the dollars alone, p10-p90 of 393-459 where the run left 318)."""
    rng = random.Random(0)
    totals = []
    for _ in range(RANGE_DRAWS):
        drawn = {
            key: replace(
                f,
                cost_usd=_draw(rng, f.cost_usd, f.cost_se),
                seconds=_draw(rng, f.seconds, f.seconds_se),
                escalated=min(1.0, max(0.0, rng.gauss(f.escalated, f.escalated_sd))),
            )
            for key, f in flows.items()
        }
        totals.append(_unsent(lanes, drawn, room, budgets))
    totals.sort()
    return totals[RANGE_DRAWS // 10], totals[RANGE_DRAWS - 1 - RANGE_DRAWS // 10]


def unsent_sd(
    lanes: list[Lane],
    flows: dict[tuple[str, str], Flow],
    room: float,
    budgets: dict[str, Budget] | None = None,
) -> dict[str, float]:
    """Per dataset, how far the items left pending move when its flows' dollars per passage
    move by their `cost_se` (a central difference, its flows' parts added in quadrature): a
    dataset before the cut moves it by its items times its error over the cut's dollars per
    item, the cut's own by the items it affords times its relative error, one after it not
    at all."""
    out: dict[str, float] = defaultdict(float)
    for key, f in flows.items():
        if f.cost_se <= 0 or f.cost_usd <= 0:
            continue
        moved = []
        for sign in (1.0, -1.0):
            cost = max(f.cost_usd * 1e-3, f.cost_usd + sign * f.cost_se)
            moved.append(_unsent(lanes, {**flows, key: replace(f, cost_usd=cost)}, room, budgets))
        out[key[1]] += ((moved[0] - moved[1]) / 2) ** 2
    return {ds: math.sqrt(v) for ds, v in out.items()}


def _unsent(
    lanes: list[Lane],
    flows: dict[tuple[str, str], Flow],
    room: float,
    budgets: dict[str, Budget] | None,
) -> float:
    """The items one play of the order leaves pending (0: the room lasts)."""
    ending = _play(lanes, flows, room, budgets)
    return 0.0 if ending is None else sum(ending.unsent.values())


def _draw(rng: random.Random, mean: float, se: float) -> float:
    """A positive figure drawn from a log-normal of its mean and error."""
    if mean <= 0 or se <= 0:
        return mean
    s = math.sqrt(math.log1p((se / mean) ** 2))
    return mean * math.exp(rng.gauss(-s * s / 2, s))


def _play(
    lanes: list[Lane],
    flows: dict[tuple[str, str], Flow],
    room: float,
    budgets: dict[str, Budget] | None,
) -> Ending | None:
    """`play` with the flows' dollars as they are: one ending."""
    work = _work(lanes, flows)
    if work <= 0:
        return None
    dt = work / STEPS
    state = _State(
        {lane.name: deque([ds, n] for ds, n in lane.own if n > 0) for lane in lanes},
        {lane.name: deque() for lane in lanes},
        defaultdict(list),
        budgets or {},
    )
    by_name = {lane.name: lane for lane in lanes}
    # Escalations keep arriving after the last own item: run until nothing is left.
    step = 0
    while step < 100 * STEPS:
        for lane_name, ds, n in state.arrivals.pop(step, []):
            state.arrive(lane_name, ds, n)
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
    per_lane = (sum(n * flows[lane.name, ds].seconds for ds, n in lane.own) for lane in lanes)
    return max(per_lane, default=0.0)


def _backlog(state: _State) -> float:
    """Escalated items still to be handed out (not those a met budget keeps)."""
    return sum(float(n) for b in state.backlog.values() for ds, n in b if not state.met(str(ds)))


def _serve(
    lane: Lane,
    lanes: dict[str, Lane],
    flows: dict[tuple[str, str], Flow],
    state: _State,
    step: int,
    dt: float,
    room: float,
) -> float | None:
    """One step of a lane: its backlog first escalated, first out, then its datasets in
    order. The share of the step at which the room ran out, or None."""
    used = 0.0
    for queue in (state.backlog[lane.name], state.own[lane.name]):
        used, out = _serve_queue(queue, lane, lanes, flows, state, step, dt, used, room)
        if out:
            return used / dt
    return None


def _serve_queue(
    queue: deque[list[float | str]],
    lane: Lane,
    lanes: dict[str, Lane],
    flows: dict[tuple[str, str], Flow],
    state: _State,
    step: int,
    dt: float,
    used: float,
    room: float,
) -> tuple[float, bool]:
    """Hand out a lane's queue ((dataset, items) in order) from its head until the step's
    lane-seconds (`used` of them gone) run out; a dataset whose budget is met is passed over,
    its items left pending, as the feeder goes on to the next. The step's lane-seconds used,
    and whether the room ran out."""
    while queue and dt - used > 1e-12:
        ds, n = str(queue[0][0]), float(queue[0][1])
        if n <= 1e-12 or state.met(ds):
            queue.popleft()
            state.held[ds] += max(0.0, n)
            continue
        sec = flows[lane.name, ds].seconds
        k = min(n, (dt - used) / sec) if sec > 0 else n
        started, out = _start(lane, lanes, flows, state, step, dt, {ds: k}, room)
        got = started.get(ds, 0.0)
        queue[0][1] = n - got
        used += got * sec
        if out:
            return used, True
        if n - got <= 1e-9:
            queue.popleft()
        elif got < k and state.left(ds, flows[lane.name, ds]) <= 1e-12:
            queue.popleft()  # its budget ran out part way: the rest stays pending
            state.held[ds] += n - got
    return used, False


def _start(
    lane: Lane,
    lanes: dict[str, Lane],
    flows: dict[tuple[str, str], Flow],
    state: _State,
    step: int,
    dt: float,
    chunk: dict[str, float],
    room: float,
) -> tuple[dict[str, float], bool]:
    """Start a chunk of passages, as far as their datasets' budgets and the job's room let
    them: their dollars and tokens are committed, their escalations scheduled. The passages
    started per dataset, and whether the room ran out."""
    allowed = {ds: min(n, state.left(ds, flows[lane.name, ds])) for ds, n in chunk.items()}
    usd = sum(n * flows[lane.name, ds].cost_usd for ds, n in allowed.items())
    share, out = 1.0, False
    if usd > 0 and state.spent + usd >= room:
        share, out = max(0.0, (room - state.spent) / usd), True
    state.spent += usd * share
    target = lane.escalate_to if lane.escalate_to in lanes else None
    started = {}
    for ds, n in allowed.items():
        f = flows[lane.name, ds]
        started[ds] = n * share
        used = state.used[ds]
        used[0] += started[ds] * f.tokens
        used[1] += started[ds] * f.cost_usd
        if target is not None and f.escalated > 0:
            at = step + 1 + int(f.held_s / dt)
            state.arrivals[at].append((target, ds, started[ds] * f.escalated))
    return started, out


def _ending(state: _State, at_s: float) -> Ending:
    """What stays pending once admission stops: own items, backlogs, and the escalations of
    the passages in flight (they arrive after the stop); a met dataset's, by its budget."""
    unsent: dict[str, float] = defaultdict(float)
    escalated: dict[str, float] = defaultdict(float)
    met: dict[str, float] = defaultdict(float)

    def add(ds: str, n: float, was_escalated: bool) -> None:
        if state.met(ds):
            met[ds] += n
            return
        unsent[ds] += n
        if was_escalated:
            escalated[ds] += n

    for queue in state.own.values():
        for ds, n in queue:
            add(str(ds), float(n), False)
    for ds, n in state.held.items():
        add(ds, n, False)
    for backlog in state.backlog.values():
        for ds, n in backlog:
            add(str(ds), float(n), True)
    for arriving in state.arrivals.values():
        for _, ds, n in arriving:
            add(ds, n, True)
    return Ending(at_s, dict(unsent), dict(escalated), dict(met))
