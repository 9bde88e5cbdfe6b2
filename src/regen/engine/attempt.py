"""An attempt at an item, step by step: what it holds from admission until its slot goes back
(`Try`), the item's attempts so far (`Tally`), its request on and off the wire, and what each
ending means for the item: an outcome, or a retry (`Verdicts`)."""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from regen.config import RunConfig
from regen.conversation import Attempt, Charge, Outcome, Result, Usage
from regen.engine.budget import Lease
from regen.engine.client.errors import RETRYABLE, STOPS_RUN
from regen.engine.commits import CommitBuffer
from regen.engine.eta import Flow
from regen.engine.failures import ErrorRate
from regen.engine.limiter import AdaptiveLimit
from regen.engine.runtime import EndpointRuntime, LaneRuntime
from regen.errors import EndpointError
from regen.state.outstanding import Sent
from regen.state.work import PendingItem

if TYPE_CHECKING:
    from regen.engine.stats import RunStats

# Signals for the limiter, by failure class: a 429 says the endpoint is full; a 503 or 529
# says so too, but also comes now and then when it is not (see limiter.py).
LIMIT_SIGNALS = {"rate_limited": "overload", "overloaded": "strained"}
# These say the endpoint itself is unwell: enough in a row cool it down.
UNHEALTHY = frozenset({"server", "connection", "timeout", "stalled"})
FAILOVERS_PER_ENDPOINT = 8
"""An item moved off failing servers more than this many times per endpoint of its lane
counts the next failures against its attempts again (so a fleet that is gone ends it)."""


def backoff_s(attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
    """Full-jitter exponential backoff (0.5 s doubling, capped at 30 s); Retry-After is a floor."""
    ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
    wait = rng.uniform(0, ceiling)
    return max(wait, retry_after_s or 0.0)


@dataclass
class Try:
    """One attempt at an item, from its admission until its slot goes back: the endpoint it
    goes to, the slot of that endpoint's limit and the lease it holds, and how its request
    ended (`Admission.settle`)."""

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
    """An item set aside by its worker (`Admission.admit`)."""

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


def on_wire(stats: RunStats, lane: LaneRuntime, item: PendingItem, att: Try) -> Flow:
    """The attempt's request goes on the wire now: it counts as in flight, in the lane's
    wire timeline, on its server's busy clock and among its flow's requests on the wire
    (the flow is returned)."""
    ds = stats.datasets[item.dataset]
    lane_stats = stats.lanes[lane.name]
    att.started, att.t0 = time.time(), time.monotonic()
    t0 = att.t0
    # "In flight" counts requests on the wire, not workers waiting for a slot.
    ds.in_flight += 1
    lane_stats.in_flight += 1
    lane_stats.wire.change(t0, +1)
    if lane_stats.wire.full_since is None and lane_stats.in_flight >= lane_stats.limit:
        lane_stats.wire.full(t0)
    att.ep.busy.change(t0, +1)
    stats.endpoints[att.ep.name].on_wire += 1
    flow = lane_stats.flow(item.dataset)
    flow.on_wire[id(att)] = t0
    flow.wire_prompts[id(att)] = item.prompt_tokens_est
    return flow


def off_wire(stats: RunStats, lane: LaneRuntime, item: PendingItem, att: Try, flow: Flow) -> None:
    """The attempt's request is off the wire, however it ended: out of the counts
    `on_wire` put it in (and its endpoint's `outstanding`), its time on the wire counted
    as an answer's latency, or as time a failure took."""
    ds = stats.datasets[item.dataset]
    lane_stats = stats.lanes[lane.name]
    att.ep.gave_back(item.conversation_id)
    ds.in_flight -= 1
    lane_stats.in_flight -= 1
    t1 = time.monotonic()
    lane_stats.wire.change(t1, -1)
    att.ep.busy.change(t1, -1)
    del flow.on_wire[id(att)]
    flow.wire_prompts.pop(id(att), None)
    ep_stats = stats.endpoints[att.ep.name]
    ep_stats.on_wire -= 1
    if att.end == "answered":
        flow.add_latency(t1 - att.t0, item.prompt_tokens_est)
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


class Verdicts:
    """What an attempt's ending means for its item: recorded among its attempts and counted,
    then the item's outcome or a retry of the kind its failure allows."""

    def __init__(
        self,
        stats: RunStats,
        run: RunConfig,
        commits: CommitBuffer,
        error_rate: ErrorRate,
        *,
        counted_tokens: Callable[[Usage], int],
        drain: Callable[[EndpointRuntime, EndpointError], bool],
        stopping: asyncio.Event,
        stop: Callable[..., None],
    ) -> None:
        self._stats = stats
        self._run = run
        self._commits = commits
        self._error_rate = error_rate
        self._counted_tokens = counted_tokens
        """What a flow counts of an answer: the budget's tokens (completion tokens without)."""
        self._drain = drain
        """Drains a server that is down: True when the attempt fails over (`ServerPool`)."""
        self._stopping = stopping
        self._stop = stop

    def classify_error(
        self, lane: LaneRuntime, item: PendingItem, att: Try, tally: Tally, exc: EndpointError
    ) -> Outcome | Retry:
        """A failed attempt: recorded, counted for its endpoint's health, its server drained
        when it is down (the item fails over), and the run stopped by the errors that stop it;
        then `retry_or_end` says what comes next."""
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
        self._stats.datasets[item.dataset].errors[cls] += 1
        self._stats.endpoints[att.ep.name].errors[cls] += 1
        att.ep.health.record(cls not in UNHEALTHY)
        failover = self._drain(att.ep, exc)
        if failover:
            tally.failovers += 1
            failover = tally.failovers <= FAILOVERS_PER_ENDPOINT * len(lane.endpoints)
        if cls == "insufficient_credits" and att.ep.job_key:
            self._stop(
                "the key made for this run reached its credit limit, the job's dollar "
                f"cap [budget].max_cost_usd (OpenRouter: {exc.message})",
                budget=True,
            )
        elif cls in STOPS_RUN:
            self._stop(f"{cls}: {exc.message}")
        return self.retry_or_end(tally, exc, failover=failover)

    def retry_or_end(self, tally: Tally, exc: EndpointError, *, failover: bool) -> Outcome | Retry:
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
        if self._stopping.is_set():
            return tally.ended(abandoned=True)
        if failover:
            return Retry(failover=True)
        return Retry(max(tally.failures, tally.rate_limited), exc.retry_after_s)

    def classify_answer(
        self, lane: LaneRuntime, item: PendingItem, att: Try, tally: Tally, result: Result
    ) -> Outcome | Retry:
        """An answer, recorded as the attempt: one from a provider the job's filters exclude is
        paid for but not used (`excluded`); any other ends the item (`use_answer`)."""
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
            return self.excluded(lane, item, att, tally, result, message)
        return self.use_answer(lane, att, tally, result)

    def excluded(
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
        ds = self._stats.datasets[item.dataset]
        ds.charge(result.usage)
        ds.errors["excluded_provider"] += 1
        tally.failures += 1
        if tally.failures >= self._run.max_attempts or self._stopping.is_set():
            return tally.ended(failure_class="excluded_provider", failure_message=message)
        return Retry(tally.failures)

    def use_answer(self, lane: LaneRuntime, att: Try, tally: Tally, result: Result) -> Outcome:
        """An answer used: the item is done, or, truncated (`length`), escalates to the lane
        with more room that its lane names."""
        att.ep.health.record(True)
        result = replace(result, attempts=att.number, endpoint=att.ep.name)
        if att.sent is not None:  # its bill is committed with the outcome, in one transaction
            self._commits.settle(att.sent.id)
        if result.finish_reason == "length" and lane.escalate_to is not None:
            return tally.ended(result=result, escalate_to=lane.escalate_to)
        return tally.ended(result=result)

    def count(
        self, lane: LaneRuntime, outcome: Outcome, *, prompt_est: int = 0, suspect: bool = False
    ) -> None:
        """An item's outcome counted in the run's statistics (its dataset, its lane's flow, the
        error rate) and buffered for the next commit; `prompt_est`: the item's estimated
        prompt tokens."""
        ds = self._stats.datasets[outcome.dataset]
        r = outcome.result
        if r is not None:
            ds.charge(r.usage)
        if not outcome.abandoned:
            flow = self._stats.lanes[lane.name].flow(outcome.dataset)
            flow.remaining = max(0, flow.remaining - 1)
            flow.prompts_left = max(0.0, flow.prompts_left - prompt_est)
            if outcome.escalate_to is not None:
                onto = self._stats.lanes[outcome.escalate_to].flow(outcome.dataset)
                onto.remaining += 1
                onto.prompts_left += prompt_est
                flow.escalated += 1
                flow.escalated_prompts += prompt_est
                flow.escalated_timed += 1
            if r is not None:
                flow.answered += 1
                flow.finished += 1
                flow.cost_usd += r.usage.cost_usd or 0.0
                if r.usage.cost_usd is not None:
                    flow.add_priced(prompt_est, r.usage.cost_usd)
                flow.tokens += self._counted_tokens(r.usage)
        if outcome.escalate_to is not None:
            self._stats.lanes[lane.name].escalated += 1
        elif r is not None:
            ds.done += 1
            self._stats.lanes[lane.name].done += 1
            self._error_rate.count(failed=False)
        elif not outcome.abandoned:
            ds.failed += 1
            if not suspect:  # a suspect counts once its streak ends (`ClientErrorJudge`)
                cause = f"{outcome.failure_class}: {outcome.failure_message}"
                self._error_rate.count(failed=True, cause=cause)
        self._commits.add(outcome)
