"""A run's live statistics: per dataset, lane and endpoint what was sent, answered, failed and
spent, the flows the ETA reads, and the ETA itself (`RunStats.etas`). The engine writes them;
view/ (the live view, /metrics, run.log's progress lines) and the summary read them."""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from regen.conversation import (
    Usage,
)
from regen.engine.eta import (
    Concurrency,
    Eta,
    FedFlow,
    Flow,
    combine,
    cut_at,
    escalation_order,
    escalations_var,
    fed_spending,
    items_left,
    lane_eta,
    spend_reaches,
    spend_rse,
)
from regen.engine.gate import Gate
from regen.engine.holds import HoldSummary
from regen.engine.limiter import AdaptiveLimit, EndpointHealth
from regen.engine.runtime import Outage


@dataclass
class DatasetStats:
    """Live counters for one dataset in this run (the store holds the durable truth)."""

    items: int = 0
    done_before: int = 0
    token_budget: int | None = None
    before: JobTotals | None = None
    """The job's totals for this dataset as the run started (from state.db): added to this
    run's counters, they are the job's totals, which survive resumes."""
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)

    def charge(self, usage: Usage) -> None:
        """Count what an answer, or an attempt billed though it failed, used and cost."""
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.cost_usd += usage.cost_usd or 0.0


@dataclass(frozen=True, slots=True)
class JobTotals:
    """What earlier runs of the job did for one dataset (state.db's ledger and attempts)."""

    done: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    """Failed attempts by class."""


LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)
"""Upper bounds (seconds) of the latency histogram that metrics and the report show."""


@dataclass
class LaneStats:
    """Live counters for one lane, and its limits (read, never changed, by progress)."""

    concurrency: int
    limits: list[AdaptiveLimit] = field(default_factory=list)
    in_flight: int = 0
    done: int = 0
    escalated: int = 0
    flows: dict[str, Flow] = field(default_factory=dict)
    """Per dataset sent in this lane: items left and times on the wire (for the ETA)."""
    wire: Concurrency = field(default_factory=Concurrency)
    datasets: list[str] = field(default_factory=list)
    """The datasets this lane sends, in order."""
    latency_counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_sum_s: float = 0.0
    escalate_to: str | None = None
    """The lane its truncated answers go on to."""
    waiting: Counter[str] = field(default_factory=Counter)
    """Workers waiting for budget room, by what holds it (`job dollar cap held by requests in
    flight`, `code: token budget held by ...`): not sent, not idle either."""
    worst_usd: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    """The worst cases the dollar caps held for its latest attempts admitted."""

    @property
    def worst_each(self) -> float:
        """What the dollar caps hold for one of its attempts in flight (0: not known)."""
        return sum(self.worst_usd) / len(self.worst_usd) if self.worst_usd else 0.0

    def observe_latency(self, seconds: float) -> None:
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum_s += seconds

    def flow(self, dataset: str) -> Flow:
        if dataset not in self.flows:
            self.flows[dataset] = Flow()
        return self.flows[dataset]

    @property
    def limit(self) -> int:
        return min(self.concurrency, sum(lim.current for lim in self.limits))


@dataclass
class EndpointStats:
    """Live counters for one endpoint of the pool in this run (all lanes)."""

    health: EndpointHealth = field(default_factory=EndpointHealth)
    """Its health (read, never changed, by views): up, cooling down, or out of the pool."""
    limits: list[AdaptiveLimit] = field(default_factory=list)
    """Its adaptive limit in each lane that uses it."""
    on_wire: int = 0
    answers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    latency_sum_s: float = 0.0
    """Seconds on the wire of its answers."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failed attempts by class."""
    outages: list[Outage] = field(default_factory=list)

    @property
    def limit(self) -> int:
        return sum(lim.current for lim in self.limits)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def resent(self) -> int:
        return sum(o.resent for o in self.outages)


@dataclass
class RunStats:
    """What progress shows while a run goes on."""

    datasets: dict[str, DatasetStats]
    lanes: dict[str, LaneStats] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    stop_reason: str | None = None
    credits_usd: float | None = None
    """The account's remaining credit, as last read (None: not known)."""
    max_cost_usd: float | None = None
    """The job's dollar cap, [budget].max_cost_usd (None: no cap), for what is left of it."""
    budget_stop: bool = False
    """The run stopped because the job's dollar cap or the credit floor was reached."""
    outage: bool = False
    """The run stopped because every server of a lane stayed down too long."""
    endpoints: dict[str, EndpointStats] = field(default_factory=dict)
    """Per endpoint of the pool: answers, failures, outages."""
    repriced: dict[str, float] = field(default_factory=dict)
    """Per endpoint: how many times its known prices its answers were billed at most, when
    more than once (the prices the worst cases of dollar caps use were raised to it)."""
    gate: Gate = field(default_factory=Gate)
    """What providers said that regen did not believe (`engine/gate.py`)."""
    recent_failures: deque[int] = field(default_factory=lambda: deque(maxlen=200))
    budget_left: Callable[[str], tuple[float | None, float | None]] | None = None
    """What a dataset's token budget and dollar cap still allow (set when budgets apply)."""
    job_usd_left: Callable[[], float | None] | None = None
    """What the job's dollar cap still allows beyond what is charged and held (None: no
    cap); the requests in flight are not taken from it (set when budgets apply)."""
    tokens_spent: Callable[[str], int] | None = None
    """The tokens a dataset used over the whole job, as its token budget counts them (set
    when budgets apply): the live view's tokens/budget column."""
    holds: Callable[[], HoldSummary] = HoldSummary
    """What is held for bills not known yet (a killed run's requests, or this run's cut
    short): set when holds are kept."""
    lane_etas: dict[str, Eta | None] = field(default_factory=dict)
    """Each lane's ETA as `etas` last found it (the job's is the latest): progress lines."""
    samples: deque[tuple[float, dict[str, tuple[int, int]]]] = field(
        default_factory=lambda: deque(maxlen=600)
    )
    """(time, {dataset: (done, completion tokens)}) about once a second, for rolling rates."""

    def rolling(self, now: float, window_s: float = 60.0) -> dict[str, tuple[float, float]]:
        """Answers and completion tokens per second over the last `window_s`, per dataset and
        for the job (`""`)."""
        counts = {name: (d.done, d.completion_tokens) for name, d in self.datasets.items()}
        if not self.samples or now - self.samples[-1][0] >= 1.0:
            self.samples.append((now, counts))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window_s:
            self.samples.popleft()
        t0, old = self.samples[0]
        span = now - t0
        out: dict[str, tuple[float, float]] = {}
        for name, (done, tokens) in counts.items():
            d0, k0 = old.get(name, (0, 0))
            out[name] = ((done - d0) / span, (tokens - k0) / span) if span > 0 else (0.0, 0.0)
        out[""] = (sum(r for r, _ in out.values()), sum(k for _, k in out.values()))
        return out

    @property
    def in_flight(self) -> int:
        return sum(d.in_flight for d in self.datasets.values())

    def _work_left(
        self,
    ) -> tuple[
        dict[str, list[tuple[Flow, int, str]]],
        dict[str, tuple[int, str]],
        dict[tuple[str, str], float],
    ]:
        """Per lane (each after the lanes that escalate to it), its datasets' (flow, items
        left, bound); the work left per dataset over the lanes, and what bounds it; and the
        escalations expected into each (lane, dataset)."""
        # A lane that escalates goes first: what it will still send on is work for the lane
        # it sends to, which cannot end before it does.
        coming: dict[tuple[str, str], float] = {}
        coming_var: dict[tuple[str, str], float] = {}
        coming_prompts: dict[tuple[str, str], float] = {}
        left: dict[str, tuple[int, str]] = {}
        out: dict[str, list[tuple[Flow, int, str]]] = {}
        # What the lanes before use of each dataset's budget (tokens, dollars): a sending lane
        # is through its items while the lane it escalates to works its backlog, so its items
        # take the budget first, and the escalations get what they leave (bench/realistic.py:
        # a math dataset's budget met on the short lane, its ~200 escalations counted as long
        # answers ahead of the agent turns, the ETA 11-37% late).
        used: dict[str, list[float]] = {}
        for name in escalation_order({n: lane.escalate_to for n, lane in self.lanes.items()}):
            lane = self.lanes[name]
            rows = out[name] = []
            for ds in lane.datasets:
                flow = lane.flow(ds)
                tokens_left, usd_left = self.budget_left(ds) if self.budget_left else (None, None)
                before = used.setdefault(ds, [0.0, 0.0])
                if tokens_left is not None:
                    tokens_left -= before[0]
                if usd_left is not None:
                    usd_left -= before[1]
                more = coming.get((name, ds), 0.0)
                n, bound = items_left(flow, tokens_left, usd_left, more)
                flow.coming_var = coming_var.get((name, ds), 0.0)
                prompts = flow.prompts_left + coming_prompts.get((name, ds), 0.0)
                flow.prompt_to_come = prompts / (flow.remaining + more) if prompts > 0 else None
                before[0] += n * (flow.tokens_per_item() or 0.0)
                before[1] += n * (flow.usd_per_item() or 0.0)
                work = n + len(flow.on_wire)
                left[ds] = (left.get(ds, (0, bound))[0] + work, bound)
                rows.append((flow, n, bound))
                if lane.escalate_to is not None:
                    key = (lane.escalate_to, ds)
                    sent_on = n * flow.escalation_share
                    coming[key] = coming.get(key, 0.0) + sent_on
                    coming_prompts[key] = coming_prompts.get(key, 0.0) + sent_on * (
                        flow.escalated_prompt() or flow.prompt_to_come or 0.0
                    )
                    coming_var[key] = coming_var.get(key, 0.0) + escalations_var(
                        flow, n, flow.coming_var
                    )
        return out, left, coming

    def _cap_binds(
        self,
        rows_of: dict[str, list[tuple[Flow, int, str]]],
        per_lane: dict[str, dict[str, Eta | None]],
        coming: dict[tuple[str, str], float],
    ) -> tuple[float, float, bool] | None:
        """When the job's dollar cap stops the work, in seconds from now, that time's sd, and
        whether the requests on the wire then are drained by it (None: it does not bind, or no
        cap). Lanes spend side by side, each dataset's work at an even rate over its time in
        its lane (a lane fed by escalations as its feeder hands them out, `fed_spending`),
        each item at what its lane and dataset's answers cost: the cap binds when the sum
        reaches what it still allows beyond the requests on the wire. A lane that ends first
        has spent all it needed; the lanes still running share only what is left."""
        room = self.job_usd_left() if self.job_usd_left else None
        if room is None:
            return None
        senders: dict[str, list[str]] = {}
        for name, lane in self.lanes.items():
            if lane.escalate_to is not None:
                senders.setdefault(lane.escalate_to, []).append(name)
        ends: dict[str, float] = {}
        spans: dict[tuple[str, str], tuple[float, float]] = {}
        pieces: list[tuple[float, float, float]] = []
        unsure = 0.0  # dollars to come times their relative error
        for name, rows in rows_of.items():
            start = 0.0
            mine: list[tuple[str, Flow, int, float]] = []
            for ds, (flow, n, _), each in zip(
                self.lanes[name].datasets, rows, usd_each(rows), strict=True
            ):
                room -= len(flow.on_wire) * each
                eta = per_lane[name].get(ds)
                end = max(start, eta.seconds) if eta is not None else start
                spans[name, ds] = (start, end)
                mine.append((ds, flow, n, each))
                unsure += n * each * spend_rse(flow)
                start = end
            if name in senders:
                fed = self._fed(name, mine, spans, senders[name], coming)
                pieces += fed_spending(fed, start)
            else:
                pieces += [(*spans[name, ds], n * each) for ds, _, n, each in mine]
            ends[name] = start
        room = max(0.0, room)
        stop = spend_reaches(pieces, room)
        if stop is None:
            return None
        # The room lasts as much longer as the dollars to come are dearer than measured.
        total = sum(usd for _, _, usd in pieces)
        sd = stop * unsure / total if total > 0 else 0.0
        slack = sum(
            lane.limit * lane.worst_each
            for name, lane in self.lanes.items()
            if ends.get(name, 0.0) >= stop
        )
        stretched = last_stretch(pieces, room, slack, stop)
        return (stop, sd, False) if stretched is None else (stretched, sd, True)

    def _fed(
        self,
        name: str,
        mine: list[tuple[str, Flow, int, float]],
        spans: dict[tuple[str, str], tuple[float, float]],
        senders: list[str],
        coming: dict[tuple[str, str], float],
    ) -> list[FedFlow]:
        """A fed lane's datasets for `fed_spending`: items left, those still to be escalated
        (sent over their dataset's time in the first lane that sends it on), lane-seconds
        each (time on the wire over the lane's limit; the lane's mean where a flow has no
        answer yet) and dollars each."""
        limit = max(1, self.lanes[name].limit)
        times = [t for _, flow, _, _ in mine for t in flow.latencies]
        mean = sum(times) / len(times) if times else 0.0
        out = []
        for ds, flow, n, each in mine:
            own = mean if flow.mean_latency is None else flow.mean_latency
            sent = next((spans[s, ds] for s in senders if (s, ds) in spans), None)
            out.append(FedFlow(n, coming.get((name, ds), 0.0), own / limit, each, sent))
        return out

    def etas(self, now: float | None = None) -> tuple[dict[str, Eta | None], Eta | None]:
        """Time left per dataset (when it will be finished in every lane that sends it) and
        for the job, with p10-p90 intervals; None where no answer has come yet."""
        now = time.monotonic() if now is None else now
        per_lane: dict[str, dict[str, Eta | None]] = {}
        rows_of, left, coming = self._work_left()
        for name, rows in rows_of.items():
            lane = self.lanes[name]
            c, rsd = lane.wire.mean(now, limit=lane.limit)
            etas = dict(zip(lane.datasets, lane_eta(rows, now, c, rsd), strict=True))
            for src_name, src in self.lanes.items():
                if src.escalate_to != name:
                    continue
                for ds, eta in etas.items():
                    feeder = per_lane.get(src_name, {}).get(ds)
                    if eta is not None and feeder is not None and coming.get((name, ds)):
                        etas[ds] = after_feeder(eta, feeder, lane.flow(ds))
            per_lane[name] = etas
        cap = self._cap_binds(rows_of, per_lane, coming)
        if cap is not None:
            stop, stop_sd, drained = cap
            # Whatever would end after the cap binds ends then, its items left unsent.
            per_lane = {
                name: {ds: e and cut_at(e, stop, stop_sd, drained) for ds, e in etas.items()}
                for name, etas in per_lane.items()
            }
        # A dataset with nothing left (complete, or its budget met) is done: not the time its
        # lane needs for the datasets before it.
        by_dataset = {
            ds: Eta(0.0, 0.0, 0.0, left[ds][1])
            if left.get(ds, (1, ""))[0] == 0
            else combine(etas[ds] for etas in per_lane.values() if ds in etas)
            for ds in self.datasets
        }
        self.lane_etas = {
            name: etas[self.lanes[name].datasets[-1]]
            for name, etas in per_lane.items()
            if self.lanes[name].datasets
        }
        job = combine(self.lane_etas.values())
        return by_dataset, job


def last_stretch(
    pieces: list[tuple[float, float, float]], room: float, slack: float, end: float
) -> float | None:
    """When the cap stops the work, its last stretch counted: admission lets a request go
    only while its worst case fits what the requests on the wire leave, so once the room is
    below the running lanes' limit times their worst cases (`slack`), the requests on the wire
    fall off about evenly to none (bench/realistic.py's capped runs: 16 to 0 over 30-40 s,
    where the full pace would have spent the same in 13-25 s). The last `slack` dollars take
    twice as long as they would at the full pace of the work they pay for, their drain in it
    (that pace is of the datasets the last dollars fall in: a cheap dataset's pace, where
    the room runs out in a dear one after it, put the end half a minute late on
    bench/realistic.py's seed 8). `end`: when the spending reaches `room` at full pace
    (`spend_reaches`). None: no worst case known, or no pace."""
    slack = min(room, slack)
    if slack <= 0:
        return None
    full = spend_reaches(pieces, room - slack) or 0.0
    return full + 2 * (end - full) if end > full else None


def usd_each(rows: list[tuple[Flow, int, str]]) -> list[float]:
    """What an item of each of a lane's flows costs: its own answers', this run's and earlier
    runs' (a pilot's), adjusted to the prompts it has still to send (`Flow.usd_per_item`); a
    flow with none, the lane's mean. A dataset not reached yet may cost several times the
    lane's mean (long each_turn prompts)."""
    paid = sum(f.cost_usd + f.earlier_cost_usd for f, _, _ in rows)
    answers = sum(f.finished + f.earlier_answers for f, _, _ in rows)
    mean = paid / answers if answers else 0.0
    out = []
    for flow, _, _ in rows:
        answered = flow.finished + flow.earlier_answers
        each = flow.usd_per_item()
        if each is None:
            each = (flow.cost_usd + flow.earlier_cost_usd) / answered if answered else mean
        out.append(each)
    return out


def after_feeder(eta: Eta, feeder: Eta, flow: Flow) -> Eta:
    """A lane fed by escalations ends no sooner than its feeder, plus one of its answers."""
    one = flow.mean_latency or 0.0
    return Eta(
        max(eta.seconds, feeder.seconds + one),
        max(eta.p10, feeder.p10 + one),
        max(eta.p90, feeder.p90 + one),
        eta.bound,
        max(eta.drain, one),
        prior=eta.prior or feeder.prior,
    )
