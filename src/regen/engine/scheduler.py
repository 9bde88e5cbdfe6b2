"""Dispatch: lanes of workers pull pending items lazily, send them through an adaptive limit per
endpoint, retry by failure class, commit outcomes in groups, and stop gracefully.

Only the items in flight live in memory: each lane has a fixed pool of `concurrency` workers
reading from a small queue that a feeder fills from the store in dispatch order. No task is
created per item.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import enum
import math
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from regen import failpoints
from regen.config import RunConfig
from regen.conversation import (
    Attempt,
    Charge,
    Conversation,
    Outcome,
    Request,
    Result,
    Usage,
    prompt_tokens_bound,
)
from regen.engine.budget import BudgetBook, Lease, Prices, billed_above, fill_cost, remember_prices
from regen.engine.client.body import sent_settings
from regen.engine.client.errors import RETRYABLE, STOPS_RUN
from regen.engine.client.http import Timeouts
from regen.engine.client.response import counted_usage
from regen.engine.commits import CommitBuffer
from regen.engine.eta import (
    Concurrency,
    Eta,
    Flow,
    combine,
    cut_at,
    escalation_order,
    items_left,
    lane_eta,
    spend_reaches,
)
from regen.engine.failures import CLIENT_ERRORS as CLIENT_ERRORS
from regen.engine.failures import JOB_WIDE_AFTER as JOB_WIDE_AFTER
from regen.engine.failures import JOB_WIDE_WAIT_S as JOB_WIDE_WAIT_S
from regen.engine.failures import ClientErrorJudge, ErrorRate
from regen.engine.feeder import Feeder, LaneQueue, until_set
from regen.engine.gate import BILL_CEILING, PROMPT_SLACK, Asked, Gate, believed
from regen.engine.holds import HoldKeeper, HoldSummary
from regen.engine.limiter import AdaptiveLimit, EndpointHealth
from regen.engine.sent_log import IDENTIFY_WRITE_EVERY_S as IDENTIFY_WRITE_EVERY_S
from regen.engine.sent_log import SENT_WRITE_EVERY_S as SENT_WRITE_EVERY_S
from regen.engine.sent_log import SentLog
from regen.errors import EndpointError, StateGone
from regen.sources.modes import build_request
from regen.state.db import Store
from regen.state.outstanding import Sent
from regen.state.work import PendingItem

# Signals for the limiter, by failure class: a 429 says the endpoint is full; a 503 or 529
# says so too, but also comes now and then when it is not (see limiter.py).
LIMIT_SIGNALS = {"rate_limited": "overload", "overloaded": "strained"}
# These say the endpoint itself is unwell: enough in a row cool it down.
UNHEALTHY = frozenset({"server", "connection", "timeout", "stalled"})


class Sender(Protocol):
    async def chat(
        self,
        item_id: str,
        body: dict[str, Any],
        *,
        stream: bool = False,
        timeouts: Timeouts | None = None,
        on_generation: Callable[[str], None] | None = None,
    ) -> Result: ...

    async def get_json(self, path: str) -> Any: ...

    async def probe(self, url: str) -> bool: ...


BILL_WAIT_S = 21.0
"""At the end of a run, how long this run's cut-short requests are looked up (their records
lag the answers) before they are left in `outstanding` for the next run."""
# A drained server's /health is probed this often, doubling up to the second figure.
PROBE_EVERY_S = (0.5, 2.0)
FAILOVERS_PER_ENDPOINT = 8
"""An item moved off failing servers more than this many times per endpoint of its lane
counts the next failures against its attempts again (so a fleet that is gone ends it)."""


@dataclass
class BusyClock:
    """The time a server had at least one of the job's requests on the wire, not yet charged
    to an answer."""

    on_wire: int = 0
    since: float = 0.0
    unbilled_s: float = 0.0

    def change(self, now: float, delta: int) -> None:
        if self.on_wire > 0:
            self.unbilled_s += now - self.since
        self.since = now
        self.on_wire += delta

    def take(self, now: float) -> float:
        """The busy seconds since the last take."""
        self.change(now, 0)
        taken, self.unbilled_s = self.unbilled_s, 0.0
        return taken


@dataclass
class EndpointRuntime:
    """One endpoint as a lane uses it: how to reach it, its share, its health."""

    name: str
    sender: Sender
    make_body: Callable[[Request, int, bool], dict[str, Any]]
    """The request body for a request, given the lane's max_tokens and whether it streams."""
    weight: float = 1.0
    health: EndpointHealth = field(default_factory=EndpointHealth)
    prices: Prices | None = None
    """For answers without `usage.cost`, and for the worst case under dollar caps."""
    generation_records: bool = False
    """The endpoint answers `GET /generation?id=` (OpenRouter): a stream cut short can be
    looked up there for what it was billed."""
    job_key: bool = False
    """Requests go out with a key made for this run (`job_keys.py`), whose credit limit is
    the job's cap: a 402 from it means the cap is met, not the account's money gone."""
    billed_after_gone: bool = False
    """A request may be billed after its client is gone (OpenRouter and other hosted APIs
    finish a generation whose connection closed; vLLM and SGLang abort it): such requests are
    recorded in `outstanding` before they are sent, under budgets."""
    excluded_providers: frozenset[str] = frozenset()
    """Provider display names that only endpoints the job excludes carry: an answer naming one
    is paid for but not used (`excluded_provider`)."""
    health_url: str | None = None
    """A self-hosted server's `/health`: a server that refuses connections, drops them or
    answers 503 (loading) is drained at once and probed there until it is back."""
    outstanding: int = 0
    """Attempts that picked this endpoint and have not finished (all lanes): the pool sends
    the next one to the endpoint with the fewest, for its weight."""
    probing: asyncio.Task[None] | None = None
    busy: BusyClock = field(default_factory=BusyClock)
    """Its busy time not yet charged to an answer (for servers priced by the hour)."""


@dataclass
class LaneRuntime:
    """A lane in this run: its settings, endpoints and one adaptive limit per endpoint."""

    name: str
    concurrency: int
    max_tokens: int
    timeouts: Timeouts
    endpoints: list[EndpointRuntime]
    datasets: list[str]
    stream: bool = False
    escalate_to: str | None = None
    limits: dict[str, AdaptiveLimit] = field(default_factory=dict)


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
class Outage:
    """An endpoint out of its pool (its server refused connections or was loading), from when
    it was drained until its health probe passed (None: still out)."""

    start: float
    """By the wall clock."""
    end: float | None = None
    resent: int = 0
    """Requests that failed on it meanwhile and went to another server (or waited for one)."""


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
        left: dict[str, tuple[int, str]] = {}
        out: dict[str, list[tuple[Flow, int, str]]] = {}
        for name in escalation_order({n: lane.escalate_to for n, lane in self.lanes.items()}):
            lane = self.lanes[name]
            rows = out[name] = []
            for ds in lane.datasets:
                flow = lane.flow(ds)
                tokens_left, usd_left = self.budget_left(ds) if self.budget_left else (None, None)
                n, bound = items_left(flow, tokens_left, usd_left)
                more = coming.get((name, ds), 0.0)
                work = n + round(more) + len(flow.on_wire)
                left[ds] = (left.get(ds, (0, bound))[0] + work, bound)
                rows.append((flow, n + round(more), bound))
                if lane.escalate_to is not None:
                    key = (lane.escalate_to, ds)
                    coming[key] = coming.get(key, 0.0) + (n + more) * flow.escalation_share
        return out, left, coming

    def _cap_binds(
        self,
        rows_of: dict[str, list[tuple[Flow, int, str]]],
        per_lane: dict[str, dict[str, Eta | None]],
    ) -> float | None:
        """When the job's dollar cap stops the work, in seconds from now (None: it does not,
        or no cap). Lanes spend side by side, each dataset's work at an even rate over its
        time in its lane, each item at what its lane and dataset's answers cost: the cap binds
        when the sum reaches what it still allows beyond the requests on the wire. A lane that
        ends first has spent all it needed; the lanes still running share only what is left."""
        room = self.job_usd_left() if self.job_usd_left else None
        if room is None:
            return None
        fed = {lane.escalate_to for lane in self.lanes.values()}
        pieces: list[tuple[float, float, float]] = []
        for name, rows in rows_of.items():
            start = 0.0
            for ds, (flow, n, _), each in zip(
                self.lanes[name].datasets, rows, usd_each(rows), strict=True
            ):
                room -= len(flow.on_wire) * each
                eta = per_lane[name].get(ds)
                end = max(start, eta.seconds) if eta is not None else start
                pieces.append((start, end, n * each))
                start = end
            if name in fed:
                # Escalated items go out as they came (the feeder ranks them first), every
                # dataset mixed: the lane spends at its mean rate over all its time.
                mine = pieces[-len(rows) :] if rows else []
                del pieces[len(pieces) - len(mine) :]
                pieces.append((0.0, start, sum(usd for _, _, usd in mine)))
        return spend_reaches(pieces, max(0.0, room))

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
        stop = self._cap_binds(rows_of, per_lane)
        if stop is not None:
            # Whatever would end after the cap binds ends then, its items left unsent.
            per_lane = {
                name: {ds: e and cut_at(e, stop) for ds, e in etas.items()}
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


def usd_each(rows: list[tuple[Flow, int, str]]) -> list[float]:
    """What an item of each of a lane's flows costs: its own answers', this run's and earlier
    runs' (a pilot's); a flow with none, the lane's mean. A dataset not reached yet may cost
    several times the lane's mean (long each_turn prompts)."""
    paid = sum(f.cost_usd + f.earlier_cost_usd for f, _, _ in rows)
    answers = sum(f.finished + f.earlier_answers for f, _, _ in rows)
    mean = paid / answers if answers else 0.0
    out = []
    for flow, _, _ in rows:
        answered = flow.finished + flow.earlier_answers
        out.append((flow.cost_usd + flow.earlier_cost_usd) / answered if answered else mean)
    return out


def after_feeder(eta: Eta, feeder: Eta, flow: Flow) -> Eta:
    """A lane fed by escalations ends no sooner than its feeder, plus one of its answers."""
    one = sum(flow.latencies) / len(flow.latencies) if flow.latencies else 0.0
    return Eta(
        max(eta.seconds, feeder.seconds + one),
        max(eta.p10, feeder.p10 + one),
        max(eta.p90, feeder.p90 + one),
        eta.bound,
        max(eta.drain, one),
        prior=eta.prior or feeder.prior,
    )


def backoff_s(attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
    """Full-jitter exponential backoff (0.5 s doubling, capped at 30 s); Retry-After is a floor."""
    ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
    wait = rng.uniform(0, ceiling)
    return max(wait, retry_after_s or 0.0)


@dataclass
class Try:
    """One attempt at an item, from its admission until its slot goes back: the endpoint it
    goes to, the slot of that endpoint's limit and the lease it holds, and how its request
    ended (`Scheduler._settle`)."""

    number: int
    ep: EndpointRuntime
    limit: AdaptiveLimit
    epoch: int
    """The epoch `limit.acquire` gave the slot, for its release."""
    lease: Lease | None
    """What it may spend under budgets (None without)."""
    sent: Sent | None = None
    """Its row in `outstanding`, written before it is sent (a request billed after its client
    is gone, under budgets)."""
    started: float = 0.0
    """When it went on the wire: by the wall clock, for its record..."""
    t0: float = 0.0
    """... and by the monotonic clock, for its latency."""
    end: Literal["cut", "answered", "unbilled", "maybe_billed"] = "cut"
    """How its request ended: answered; failed, not billed; failed, but the provider may have
    billed it; or cut short (cancelled, or an error on this side)."""
    billed: Usage | None = None
    """An answer's usage, priced."""
    begun: str | None = None
    """The generation id of a request that may have been billed: its bill is looked up by it."""


@dataclass
class Tally:
    """An item's attempts so far, and its retries of each kind (each kind has its own limit)."""

    item: PendingItem
    attempts: list[Attempt] = field(default_factory=list)
    number: int = 0
    """The current attempt's number (1 for the first)."""
    failures: int = 0
    """Failed attempts, against [run].max_attempts."""
    rate_limited: int = 0
    """429s, against [run].max_rate_limit_retries."""
    failovers: int = 0
    """Moves off drained servers, against FAILOVERS_PER_ENDPOINT."""

    def ended(self, **kw: Any) -> Outcome:
        """The item's outcome, with its attempts."""
        return Outcome(self.item.id, self.item.dataset, tuple(self.attempts), **kw)


class Deferred(enum.Enum):
    """An item set aside by its worker (`Scheduler._admit`)."""

    DEFERRED = "deferred"


DEFERRED = Deferred.DEFERRED


@dataclass(frozen=True, slots=True)
class Retry:
    """An item to be tried again: at once, on another server or the first to come back
    (`failover`), or after a backoff for its `tries` so far, no shorter than the server's
    Retry-After."""

    tries: int = 0
    retry_after_s: float | None = None
    failover: bool = False


class Scheduler:
    """Runs every pending item of the lanes through their endpoints."""

    def __init__(
        self,
        store: Store,
        lanes: list[LaneRuntime],
        run: RunConfig,
        stats: RunStats,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        commit_interval_s: float = 0.2,
        budget: BudgetBook | None = None,
        pilot: Mapping[str, int] | None = None,
        sequential: Iterable[str] = (),
        run_id: int = 0,
        keeper: HoldKeeper | None = None,
    ) -> None:
        self._store = store
        self._budget = budget
        self.keeper = keeper
        """Finds the bills of held requests (None: nothing is held, as without budgets)."""
        self._probes: set[asyncio.Task[None]] = set()
        self._lanes = {lane.name: lane for lane in lanes}
        self._run = run
        self.stats = stats
        self._sleep = sleep
        self._rng = rng or random.Random(run.shuffle_seed)
        self._stopping = asyncio.Event()
        self._stopped_at = 0.0
        self._gone = asyncio.Event()
        self._gone_error: StateGone | None = None
        """state.db was deleted or replaced (whichever write saw it first): the run ends with it."""
        """Set when state.db is gone: nothing can be saved any more."""
        self._lane_done = {lane.name: asyncio.Event() for lane in lanes}
        self._commits = CommitBuffer(
            store, commit_interval_s, stop=self.stop, gone=self._state_gone
        )
        """Outcomes, bills and settled requests, committed in groups."""
        self._sent_log = SentLog(store, run_id, stop=self.stop, gone=self._state_gone)
        """Requests that may be billed after their client is gone, written before they go."""
        self._error_rate = ErrorRate(stats, run, self.stop)
        self._judge = ClientErrorJudge(stats, self._commits, self._error_rate, self.stop)
        """Whether a client error that ends items in a row is the job's."""
        self._feeder = Feeder(
            store,
            self._lanes,
            stats,
            self._commits,
            stopping=self._stopping,
            lane_done=self._lane_done,
            budget=budget,
            pilot=pilot,
            sequential=set(sequential),
        )
        self._down_since: dict[str, float] = {}
        """When every server of a lane was drained (its items wait for one to come back)."""
        self._revived = asyncio.Event()
        """Set when a drained server comes back (then replaced for the next wait)."""
        for lane in lanes:
            for ep in lane.endpoints:
                lane.limits[ep.name] = AdaptiveLimit(
                    lane.concurrency, run.initial_limit, adaptive=run.adaptive
                )
                ep_stats = self.stats.endpoints.setdefault(ep.name, EndpointStats(ep.health))
                ep_stats.limits.append(lane.limits[ep.name])
            self.stats.lanes[lane.name] = LaneStats(
                lane.concurrency,
                list(lane.limits.values()),
                datasets=list(lane.datasets),
                escalate_to=lane.escalate_to,
            )
        pending = store.work.pending_flows()
        for (lane_name, ds), (n, _) in pending.items():
            if lane_name in self.stats.lanes:
                self.stats.lanes[lane_name].flow(ds).remaining += n
        # Earlier runs' answers (a pilot's) start each flow's latencies, so that the ETA rests
        # on a dataset's own times from the start, not on the datasets that happen to go first.
        for (lane_name, ds), answers in store.spend.earlier_latencies().items():
            if lane_name in self.stats.lanes:
                n, est = pending.get((lane_name, ds), (0, 0))
                self.stats.lanes[lane_name].flow(ds).start_from(answers, n, est)
        for (lane_name, ds), ages in store.outstanding.cut_short().items():
            if lane_name in self.stats.lanes:
                self.stats.lanes[lane_name].flow(ds).cut_short.extend(ages)
        for lane_name, on_wire in store.runs.earlier_on_wire().items():
            if lane_name in self.stats.lanes:
                self.stats.lanes[lane_name].wire.earlier = on_wire
        for (lane_name, ds), (answered, escalated, usd) in store.spend.lane_answers().items():
            if lane_name in self.stats.lanes:
                flow = self.stats.lanes[lane_name].flow(ds)
                flow.answered += answered
                flow.escalated += escalated
                flow.earlier_cost_usd += usd
        if budget is not None:
            self.stats.budget_left = budget.left
            self.stats.tokens_spent = budget.tokens_spent
            self.stats.job_usd_left = budget.job_usd_left

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, reason: str, *, budget: bool = False, outage: bool = False) -> None:
        """Stop dispatching; requests in flight may finish (up to [run].stop_grace_s).
        `budget`: a planned end (the job's dollar cap or credit floor), not a failure;
        `outage`: every server of a lane stayed down (the next run sends what is left)."""
        if not self._stopping.is_set():
            self.stats.stop_reason = reason
            self.stats.budget_stop = budget
            self.stats.outage = outage
            self._stopped_at = time.monotonic()
            self._stopping.set()

    async def run(self) -> None:
        failpoints.reached("start")
        tasks: list[asyncio.Task[None]] = []
        workers: list[asyncio.Task[None]] = []
        for lane in self._lanes.values():
            queue = LaneQueue(lane.concurrency)
            tasks.append(asyncio.create_task(self._feeder.feed(lane, queue)))
            lane_workers = [
                asyncio.create_task(self._work(lane, queue)) for _ in range(lane.concurrency)
            ]
            workers += lane_workers
            tasks.append(asyncio.create_task(self._mark_done(lane.name, lane_workers)))
        tasks.append(asyncio.create_task(self._commits.loop()))
        tasks.append(asyncio.create_task(self._deadline(workers)))
        keeper = self.keeper
        keeping = asyncio.create_task(keeper.run()) if keeper is not None else None
        try:
            await asyncio.gather(*workers, return_exceptions=True)
            self._judge.judge(None, 0.0)  # a streak of one client error that nothing answered
            if keeping is not None:
                keeping.cancel()
                await asyncio.gather(keeping, return_exceptions=True)
            if keeper is not None and keeper.held:
                # Bills of this run's requests cut short: looked up for a few seconds more;
                # what is still held then stays in `outstanding` for the next run.
                wait_s = BILL_WAIT_S
                if self.stopping:  # within what is left of the stop's grace period
                    grace_end = self._stopped_at + self._run.stop_grace_s
                    wait_s = min(wait_s, max(0.0, grace_end - time.monotonic()))
                await keeper.settle_all(wait_s)
            # Answers finished since the last tick: a failed write is retried too.
            self._commits.flush()
            # Answers that could not be written (a full disk) are tried again until the stop's
            # grace period ends: space freed meanwhile saves them.
            await self._commits.retry_unsaved(self._stopped_at + self._run.stop_grace_s)
        finally:
            rest = tasks + workers + list(self._probes) + ([keeping] if keeping else [])
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            self._commits.flush()
        self._commits.raise_unsaved()
        if self._gone_error is not None:
            raise self._gone_error

    def _state_gone(self, exc: StateGone) -> None:
        """A write found state.db deleted or replaced: requests in flight are abandoned at once
        (nothing can be saved) and the run ends with this error, whichever write saw it."""
        if self._gone_error is None:
            self._gone_error = exc
        self._gone.set()

    async def _mark_done(self, lane: str, workers: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*workers, return_exceptions=True)
        self._lane_done[lane].set()

    async def _deadline(self, workers: list[asyncio.Task[None]]) -> None:
        # After a stop, requests in flight get stop_grace_s to finish; then they are abandoned
        # (their items stay pending and are sent again by the next run).
        await self._stopping.wait()
        # Nothing can be saved once state.db is gone: no grace for requests in flight.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), self._run.stop_grace_s)
        for w in workers:
            w.cancel()

    async def _work(self, lane: LaneRuntime, queue: LaneQueue) -> None:
        while True:
            item = await queue.get()
            if item is None or self.stopping:
                return
            outcome = await self._process(lane, item)
            if outcome is not None:  # None: set aside until its dataset's budget has room
                self._record(lane, outcome)

    def _pick(self, lane: LaneRuntime) -> EndpointRuntime:
        """The healthy endpoint with the fewest attempts outstanding for its weight (ties:
        at random); when none is healthy, the one that cools down first."""
        eps = lane.endpoints
        if len(eps) == 1:
            return eps[0]
        healthy = [e for e in eps if e.health.healthy]
        if not healthy:
            return min(eps, key=lambda e: (e.health.cool_until, self._rng.random()))
        return min(healthy, key=lambda e: ((e.outstanding + 1) / e.weight, self._rng.random()))

    def _gate(
        self, ep: EndpointRuntime, result: Result, lane: LaneRuntime, req: Request, att: Try
    ) -> Usage:
        """The answer's usage if the gate believes it, else its worst case: at most max_tokens
        written, a prompt within its bound, a bill within BILL_CEILING x the attempt's worst
        case and above BILL_FLOOR x its completion at the lowest listed price."""
        prices, usage = ep.prices, result.usage
        # The prompt's bound costs a pass over the prompt: taken only when a count needs it
        # (a prompt within the slack's tokens passes whatever the bound; a junk count is
        # charged the bound), or for the worst case of a bill on a lease-free attempt.
        needs_bound = bool(usage.junk) or usage.prompt_tokens > PROMPT_SLACK[1]
        bound = prompt_tokens_bound(req) if needs_bound else None
        worst: float | None = None
        if att.lease is not None and att.lease.worst_usd > 0:
            worst = att.lease.worst_usd
        elif prices is not None and not prices.usd_per_s and usage.cost_usd is not None:
            worst = prices.cost(bound or prompt_tokens_bound(req), lane.max_tokens)
        asked = Asked(
            max_tokens=lane.max_tokens,
            prompt_bound=bound,
            worst_usd=worst,
            floor_usd_per_token=prices.floor if prices is not None else None,
        )
        who = (
            f"{result.provider} (endpoint {ep.name})" if result.provider else f"endpoint {ep.name}"
        )
        return self.stats.gate.usage(usage, asked, channel="an answer", who=who)

    def _learn_price(self, ep: EndpointRuntime, usage: Usage) -> None:
        """Raise the endpoint's prices when an answer was billed more than they say it costs (a
        price list gone stale, or prices in the job file below the provider's): a dollar cap's
        worst cases must not be below what requests really cost."""
        factor = billed_above(ep.prices, usage)
        if ep.prices is None or factor is None:
            return
        before = self.stats.repriced.get(ep.name, 1.0)
        total = min(BILL_CEILING, before * factor)  # a bill above it is not believed
        if total <= before:
            return
        ep.prices = ep.prices.scaled(total / before)
        self.stats.repriced[ep.name] = total
        remember_prices(self._store, ep.name, ep.prices.scaled(1 / total), total)

    def _drain(self, lane: LaneRuntime, ep: EndpointRuntime, exc: EndpointError) -> bool:
        """A self-hosted server that refused or dropped a connection, or is loading (503),
        leaves the pool until its health probe passes. True when the attempt is a failover:
        the server was drained, and the item goes to another healthy endpoint of the lane at
        once, or waits for one to come back (`_pool_back`), without using up an attempt."""
        if ep.health_url is None:
            return False
        if exc.failure_class != "connection" and exc.status != 503:
            return False
        outages = self.stats.endpoints[ep.name].outages
        if not ep.health.drained:
            ep.health.drain()
            outages.append(Outage(time.time()))
            if ep.probing is None or ep.probing.done():
                ep.probing = asyncio.create_task(self._probe(ep))
                self._probes.add(ep.probing)
                ep.probing.add_done_callback(self._probes.discard)
        outages[-1].resent += 1
        return True

    async def _pool_back(self, lane: LaneRuntime) -> bool:
        """When every server of the lane is drained, wait for a health probe to bring one
        back, for at most [run].pool_down_timeout_s from when the last one went down; then
        stop the run (its items stay pending). False: the run stops."""
        if not all(e.health.drained for e in lane.endpoints):
            return not self.stopping
        since = self._down_since.setdefault(lane.name, time.monotonic())
        bound = self._run.pool_down_timeout_s
        while all(e.health.drained for e in lane.endpoints) and not self.stopping:
            left = since + bound - time.monotonic()
            if left <= 0:
                names = ", ".join(e.name for e in lane.endpoints)
                self.stop(
                    f"every server of lane {lane.name} ({names}) has been down for {bound:g} s "
                    "(connections refused, or loading: /health never answered 200); start them "
                    "(or raise [run].pool_down_timeout_s) and run again to send what is left",
                    outage=True,
                )
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until_stop(self._revived.wait()), left)
        return not self.stopping

    async def _probe(self, ep: EndpointRuntime) -> None:
        """Probe a drained server's /health until it answers 200, then put it back."""
        assert ep.health_url is not None
        wait, most = PROBE_EVERY_S
        while not self.stopping:
            await self._until_stop(self._sleep(wait))
            if self.stopping:
                return
            if await ep.sender.probe(ep.health_url):
                ep.health.revive()
                self.stats.endpoints[ep.name].outages[-1].end = time.time()
                self._down_since.clear()
                revived, self._revived = self._revived, asyncio.Event()
                revived.set()
                return
            wait = min(most, wait * 2)

    async def _process(self, lane: LaneRuntime, item: PendingItem) -> Outcome | None:
        """Send an item until it ends: answered (or escalated to another lane), failed for
        good, or abandoned (the run stops, or the lane's servers stay down). Each attempt is
        admitted, sent and settled, then classified: the item's outcome, or a retry, which
        waits its turn. None: its first attempt found its dataset's room held by requests in
        flight, and it went back to the feeder (`Feeder.defer`) rather than hold the worker."""
        req = self._request(item)
        tally = Tally(item)
        deferrable = self._feeder.deferrable(item)
        while True:
            try:
                att = await self._admit_try(lane, item, req, tally, defer=deferrable)
            except BaseException:
                if deferrable:
                    self._feeder.decided(lane.name, item)
                raise
            if att is DEFERRED:
                return None  # the feeder has it back (`Feeder.defer`)
            if deferrable:  # its first attempt was admitted, or it ends unsent
                deferrable = False
                self._feeder.decided(lane.name, item)
            if att is None:
                return tally.ended(abandoned=True)
            step = await self._attempt(lane, item, req, att, tally)
            if isinstance(step, Outcome):
                return step
            if not await self._before_retry(step):
                return tally.ended(abandoned=True)

    def _request(self, item: PendingItem) -> Request:
        """The request for an item's turn, with the conversation before it."""
        # Only the history before the turn is sent: the turn and those after it are not read
        # into messages (in a two-message row they were half of the parsing).
        history = {
            "messages": item.conversation["messages"][: item.turn_index],
            "tools": item.conversation.get("tools"),
        }
        conv = Conversation.from_dict(item.dataset, item.row_index, history)
        regenerated = None
        if item.after_item is not None:
            regenerated = self._store.answers.regenerated_turns(
                item.conversation_id, item.turn_index
            )
        return build_request(
            conv, item.turn_index, item.conversation_id, regenerated, sample=item.sample
        )

    async def _admit_try(
        self, lane: LaneRuntime, item: PendingItem, req: Request, tally: Tally, *, defer: bool
    ) -> Try | Deferred | None:
        """The item's next attempt, admitted: an endpoint of the lane picked once one is up, a
        slot of its limit and, under budgets, a lease taken (`_admit`), and the request
        recorded in `outstanding` when it may be billed after its client is gone. None: it is
        not sent (the run stops, a budget is met, or state.db cannot be written); DEFERRED
        (`defer`): set aside while its dataset's room is held by requests in flight."""
        if not await self._pool_back(lane):  # every server of the lane is down
            return None
        tally.number += 1
        ep = self._pick(lane)
        limit = lane.limits[ep.name]
        ep.outstanding += 1
        try:
            admitted = await self._admit(
                lane, ep, limit, item, req, defer=defer, retry=tally.number > 1
            )
        except BaseException:
            ep.outstanding -= 1
            raise
        if admitted is None or admitted is DEFERRED:
            ep.outstanding -= 1
            if admitted is DEFERRED:
                tally.number -= 1
            return admitted
        lease, epoch = admitted
        att = Try(tally.number, ep, limit, epoch, lease)
        if lease is not None and ep.billed_after_gone and self._budget is not None:
            att.sent = self._sent_log.sent(
                lease, item, lane=lane.name, endpoint=ep.name, total_s=lane.timeouts.total_s
            )
            if not await self._sent_log.record():
                # Not recorded, so not sent: state.db cannot be written (the run stops).
                self._budget.settle(lease, None)
                limit.release("other", epoch=epoch)
                ep.outstanding -= 1
                return None
        return att

    async def _attempt(
        self, lane: LaneRuntime, item: PendingItem, req: Request, att: Try, tally: Tally
    ) -> Outcome | Retry:
        """Send an admitted attempt and classify how it went. Its slot goes back to the
        endpoint's limit exactly once: before a retry, with the server's Retry-After; else on
        the way out, saying "ok" (and the latency) for an answer, the signal of its failure's
        class for an error (LIMIT_SIGNALS), "other" when it was cut short."""
        signal, latency = "other", None
        try:
            result = await self._send(lane, item, req, att)
            signal, latency = "ok", result.latency_s
        except EndpointError as exc:
            signal = LIMIT_SIGNALS.get(exc.failure_class, "other")
            step = self._classify_error(lane, item, att, tally, exc)
            if isinstance(step, Retry):
                att.limit.release(signal, epoch=att.epoch, retry_after_s=exc.retry_after_s)
                signal = "released"
            return step
        finally:
            if signal != "released":
                att.limit.release(signal, epoch=att.epoch, latency_s=latency)
        return self._classify_answer(lane, item, att, tally, result)

    async def _send(self, lane: LaneRuntime, item: PendingItem, req: Request, att: Try) -> Result:
        """Send an admitted attempt's request and price its answer, or raise its EndpointError.
        However it ends, the request comes off the wire's counts (`_off_wire`) and its lease
        is settled or held (`_settle`)."""
        ep = att.ep
        flow = self._on_wire(lane, item, att)
        try:
            body = ep.make_body(req, lane.max_tokens, lane.stream)
            result = await ep.sender.chat(
                item.id,
                body,
                stream=lane.stream,
                timeouts=lane.timeouts,
                on_generation=(
                    None if att.sent is None else self._sent_log.identifier(att.sent.id)
                ),
            )
            # What was sent: the batcher's one request for a prompt's samples, else the body.
            settings = result.settings or sent_settings(body)
            result = replace(self._price(ep, item, result, lane, req, att), settings=settings)
            att.billed, att.end = result.usage, "answered"
            return result
        except EndpointError as exc:
            # The provider may have billed it: the request is held until its bill is found (by
            # its generation id) or its deadline passes.
            maybe_billed = exc.maybe_billed and ep.billed_after_gone
            att.end = "maybe_billed" if maybe_billed else "unbilled"
            att.begun = exc.generation_id if maybe_billed else None
            raise
        finally:
            self._off_wire(lane, item, att, flow)
            self._settle(att)
            # What the client learned of its server (a refused field, `n` ignored): said once.
            learned = getattr(ep.sender, "learned", None)
            while learned:
                self.stats.gate.say(learned.pop(0))

    def _on_wire(self, lane: LaneRuntime, item: PendingItem, att: Try) -> Flow:
        """The attempt's request goes on the wire now: it counts as in flight, in the lane's
        wire timeline, on its server's busy clock and among its flow's requests on the wire
        (the flow is returned)."""
        ds = self.stats.datasets[item.dataset]
        lane_stats = self.stats.lanes[lane.name]
        att.started, att.t0 = time.time(), time.monotonic()
        t0 = att.t0
        # "In flight" counts requests on the wire, not workers waiting for a slot.
        ds.in_flight += 1
        lane_stats.in_flight += 1
        lane_stats.wire.change(t0, +1)
        if lane_stats.wire.full_since is None and lane_stats.in_flight >= lane_stats.limit:
            lane_stats.wire.full(t0)
        att.ep.busy.change(t0, +1)
        self.stats.endpoints[att.ep.name].on_wire += 1
        flow = lane_stats.flow(item.dataset)
        flow.on_wire[id(att)] = t0
        return flow

    def _off_wire(self, lane: LaneRuntime, item: PendingItem, att: Try, flow: Flow) -> None:
        """The attempt's request is off the wire, however it ended: out of the counts
        `_on_wire` put it in (and its endpoint's `outstanding`), its time on the wire counted
        as an answer's latency, or as time a failure took."""
        ds = self.stats.datasets[item.dataset]
        lane_stats = self.stats.lanes[lane.name]
        att.ep.outstanding -= 1
        ds.in_flight -= 1
        lane_stats.in_flight -= 1
        t1 = time.monotonic()
        lane_stats.wire.change(t1, -1)
        att.ep.busy.change(t1, -1)
        del flow.on_wire[id(att)]
        ep_stats = self.stats.endpoints[att.ep.name]
        ep_stats.on_wire -= 1
        if att.end == "answered":
            flow.add_latency(t1 - att.t0)
            lane_stats.observe_latency(t1 - att.t0)
            ep_stats.answers += 1
            ep_stats.latency_sum_s += t1 - att.t0
            if att.billed is not None:
                ep_stats.prompt_tokens += att.billed.prompt_tokens
                ep_stats.completion_tokens += att.billed.completion_tokens
                ep_stats.reasoning_tokens += att.billed.reasoning_tokens
                ep_stats.cost_usd += att.billed.cost_usd or 0.0
        else:
            flow.failed_wire_s += t1 - att.t0

    def _price(
        self,
        ep: EndpointRuntime,
        item: PendingItem,
        result: Result,
        lane: LaneRuntime,
        req: Request,
        att: Try,
    ) -> Result:
        """An answer with its usage counted and its cost filled in. What the provider said
        passes the gate first: usage it does not believe is charged at the attempt's worst
        case (the answer is kept, flagged). Then a server priced by the second charges its
        busy time; otherwise the bill stands (and raises the endpoint's prices when above
        them), or the prices give the cost."""
        result = counted_usage(result, item.prompt_tokens_est)
        usage = self._gate(ep, result, lane, req, att)
        if ep.prices is not None and ep.prices.usd_per_s:
            busy_s = ep.busy.take(time.monotonic())
            usage = replace(usage, cost_usd=busy_s * ep.prices.usd_per_s)
        elif believed(usage):
            self._learn_price(ep, usage)
        usage = fill_cost(usage, ep.prices)
        if usage is not result.usage:  # a Result's copy costs a few us: only if new
            result = replace(result, usage=usage)
        return result

    def _settle(self, att: Try) -> None:
        """Under budgets, the attempt's lease: settled by an answer's bill, or by none when the
        request failed unbilled (its row leaves `outstanding` with the next commit); else held,
        when the provider may have billed a request cut short by an error (the keeper looks
        its bill up), or when it was cancelled at the end of a stop (its row stays in
        `outstanding` for the next run)."""
        lease, sent = att.lease, att.sent
        if lease is None or self._budget is None:
            return
        if att.end in ("answered", "unbilled"):
            self._budget.settle(lease, att.billed)
            if sent is not None and att.end == "unbilled":
                self._commits.settle(sent.id)
            return
        kept = sent is not None and att.end == "maybe_billed" and self.keeper is not None
        self._budget.hold(lease, awaited=kept and att.begun is not None)
        if kept and sent is not None and self.keeper is not None:
            if att.begun is not None:
                sent = replace(sent, generation_id=att.begun)
            self.keeper.add(sent)

    def _classify_error(
        self, lane: LaneRuntime, item: PendingItem, att: Try, tally: Tally, exc: EndpointError
    ) -> Outcome | Retry:
        """A failed attempt: recorded, counted for its endpoint's health, its server drained
        when it is down (the item fails over), and the run stopped by the errors that stop it;
        then `_retry_or_end` says what comes next."""
        cls = exc.failure_class
        tally.attempts.append(
            Attempt(
                att.number,
                att.started,
                time.monotonic() - att.t0,
                exc.status,
                cls,
                exc.message,
                generation_id=exc.generation_id,
                lane=lane.name,
                endpoint=att.ep.name,
            )
        )
        self.stats.datasets[item.dataset].errors[cls] += 1
        self.stats.endpoints[att.ep.name].errors[cls] += 1
        att.ep.health.record(cls not in UNHEALTHY)
        failover = self._drain(lane, att.ep, exc)
        if failover:
            tally.failovers += 1
            failover = tally.failovers <= FAILOVERS_PER_ENDPOINT * len(lane.endpoints)
        if cls == "insufficient_credits" and att.ep.job_key:
            self.stop(
                "the key made for this run reached its credit limit, the job's dollar "
                f"cap [budget].max_cost_usd (OpenRouter: {exc.message})",
                budget=True,
            )
        elif cls in STOPS_RUN:
            self.stop(f"{cls}: {exc.message}")
        return self._retry_or_end(tally, exc, failover=failover)

    def _retry_or_end(self, tally: Tally, exc: EndpointError, *, failover: bool) -> Outcome | Retry:
        """After a failed attempt, the item fails when its error is not worth another or it
        used up the retries of its kind (a failover uses none), is abandoned when the run
        stops, or is tried again: at once when it fails over, else after a backoff."""
        cls = exc.failure_class
        if cls == "rate_limited":
            tally.rate_limited += 1
            exhausted = tally.rate_limited > self._run.max_rate_limit_retries
        elif failover:
            exhausted = False
        else:
            tally.failures += 1
            exhausted = tally.failures >= self._run.max_attempts
        if cls not in RETRYABLE or exhausted:
            return tally.ended(failure_class=cls, failure_message=exc.message)
        if self.stopping:
            return tally.ended(abandoned=True)
        if failover:
            return Retry(failover=True)
        return Retry(max(tally.failures, tally.rate_limited), exc.retry_after_s)

    async def _before_retry(self, retry: Retry) -> bool:
        """Wait before an item's next attempt. False: the run stopped meanwhile."""
        if retry.failover:  # straight to another server, or to one that comes back (`_pool_back`)
            return True
        await self._backoff(backoff_s(retry.tries, retry.retry_after_s, self._rng))
        return not self.stopping

    def _classify_answer(
        self, lane: LaneRuntime, item: PendingItem, att: Try, tally: Tally, result: Result
    ) -> Outcome | Retry:
        """An answer, recorded as the attempt: one from a provider the job's filters exclude is
        paid for but not used (`_excluded`); any other ends the item (`_use_answer`)."""
        excluded = result.provider is not None and result.provider in att.ep.excluded_providers
        message = (
            f"answered by {result.provider}, which the job's provider filters exclude"
            if excluded
            else None
        )
        tally.attempts.append(
            Attempt(
                att.number,
                att.started,
                result.latency_s,
                200,
                "excluded_provider" if excluded else None,
                message,
                result.provider,
                result.generation_id,
                lane.name,
                att.ep.name,
            )
        )
        if excluded:
            return self._excluded(lane, item, att, tally, result, message)
        return self._use_answer(lane, att, tally, result)

    def _excluded(
        self,
        lane: LaneRuntime,
        item: PendingItem,
        att: Try,
        tally: Tally,
        result: Result,
        message: str | None,
    ) -> Outcome | Retry:
        """Served by an endpoint the job excludes: paid for, never used. Another attempt may be
        routed elsewhere, after a backoff, unless the item's attempts are used up or the run
        stops: then it fails."""
        self._commits.charge(
            Charge(
                item.id,
                item.dataset,
                result.usage,
                result.generation_id or f"excluded:{item.id}:{att.number}",
                att.ep.name,
                result.provider,
                lane.name,
            )
        )
        if att.sent is not None:
            self._commits.settle(att.sent.id)
        ds = self.stats.datasets[item.dataset]
        ds.charge(result.usage)
        ds.errors["excluded_provider"] += 1
        tally.failures += 1
        if tally.failures >= self._run.max_attempts or self.stopping:
            return tally.ended(failure_class="excluded_provider", failure_message=message)
        return Retry(tally.failures)

    def _use_answer(self, lane: LaneRuntime, att: Try, tally: Tally, result: Result) -> Outcome:
        """An answer used: the item is done, or, truncated (`length`), escalates to the lane
        with more room that its lane names."""
        att.ep.health.record(True)
        result = replace(result, attempts=att.number, endpoint=att.ep.name)
        if att.sent is not None:  # its bill is committed with the outcome, in one transaction
            self._commits.settle(att.sent.id)
        if result.finish_reason == "length" and lane.escalate_to is not None:
            return tally.ended(result=result, escalate_to=lane.escalate_to)
        return tally.ended(result=result)

    def settle_held(self, charge: Charge | None, key: int) -> None:
        """A held request's bill (None: not billed) goes to the ledger with the next commit,
        and the request leaves `outstanding` in the same transaction."""
        if charge is not None:
            self._commits.charge(charge)
            if charge.dataset in self.stats.datasets:
                self.stats.datasets[charge.dataset].charge(charge.usage)
        self._commits.settle(key)

    async def _admit(
        self,
        lane: LaneRuntime,
        ep: EndpointRuntime,
        limit: AdaptiveLimit,
        item: PendingItem,
        req: Request,
        *,
        defer: bool = False,
        retry: bool = False,
    ) -> tuple[Lease | None, int] | Deferred | None:
        """Take a slot of the endpoint's limit and, under budgets, a lease: the lease (None
        without budgets) and the slot's epoch, or None when the item must not be sent now (a
        budget is met, or the run stops). The slot comes first, so that only attempts about to
        be sent hold budget. `defer`: when the dataset's own room is held by requests in
        flight, the item goes back to the feeder (DEFERRED) instead of waiting here."""
        while True:
            # A retry takes the next free slot, ahead of items not tried yet.
            epoch = await limit.acquire(first=retry)
            if self.stopping:
                limit.release("other", epoch=epoch)
                return None
            if self._budget is None:
                return None, epoch
            decision = self._budget.admit(
                item.dataset,
                lane.name,
                max_tokens=lane.max_tokens,
                prompt_tokens_est=item.prompt_tokens_est,
                prompt_tokens_bound=lambda: prompt_tokens_bound(req),
                prices=ep.prices,
            )
            if isinstance(decision, Lease):
                return decision, epoch
            limit.release("other", epoch=epoch)
            if not decision.wait:
                if decision.stops_run:
                    self.stop(decision.reason, budget=True)
                return None
            if defer and decision.dataset:
                self._feeder.defer(lane.name, item)
                return DEFERRED
            why = f"{item.dataset}: {decision.reason}" if decision.dataset else decision.reason
            waiting = self.stats.lanes[lane.name].waiting
            waiting[why] += 1
            try:
                await self._until_stop(self._budget.changed(item.dataset, lane.name))
            finally:
                waiting[why] -= 1
                if not waiting[why]:
                    del waiting[why]

    async def _backoff(self, seconds: float) -> None:
        """Sleep, but wake at once when the run stops."""
        await self._until_stop(self._sleep(seconds))

    async def _until_stop(self, waiting: Awaitable[Any]) -> None:
        """Wait for something, but wake at once when the run stops."""
        await until_set(waiting, self._stopping)

    def _record(self, lane: LaneRuntime, outcome: Outcome) -> None:
        """An item's outcome, weighed by the judge of client errors, counted and buffered for
        the next commit."""
        outcome, suspect = self._judge.weigh(outcome)
        self._count(lane, outcome, suspect=suspect)

    def _count(self, lane: LaneRuntime, outcome: Outcome, *, suspect: bool = False) -> None:
        ds = self.stats.datasets[outcome.dataset]
        r = outcome.result
        if r is not None:
            ds.charge(r.usage)
        if not outcome.abandoned:
            flow = self.stats.lanes[lane.name].flow(outcome.dataset)
            flow.remaining = max(0, flow.remaining - 1)
            if outcome.escalate_to is not None:
                self.stats.lanes[outcome.escalate_to].flow(outcome.dataset).remaining += 1
                flow.escalated += 1
            if r is not None:
                flow.answered += 1
                flow.finished += 1
                flow.cost_usd += r.usage.cost_usd or 0.0
                flow.tokens += (
                    self._budget.counted_tokens(r.usage)
                    if self._budget is not None
                    else r.usage.completion_tokens
                )
        if outcome.escalate_to is not None:
            self.stats.lanes[lane.name].escalated += 1
        elif r is not None:
            ds.done += 1
            self.stats.lanes[lane.name].done += 1
            self._error_rate.count(failed=False)
        elif not outcome.abandoned:
            ds.failed += 1
            if not suspect:  # a suspect counts once its streak ends (`ClientErrorJudge`)
                cause = f"{outcome.failure_class}: {outcome.failure_message}"
                self._error_rate.count(failed=True, cause=cause)
        self._commits.add(outcome)

    def flush(self) -> None:
        """Commit what finished now, rather than at the next tick."""
        self._commits.flush()
