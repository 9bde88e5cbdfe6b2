"""Budgets: admission of every attempt under token budgets and dollar caps.

Admission. Every attempt takes a lease before it is sent. Token budgets (per dataset) reserve
what each attempt in flight may use: its max_tokens until `RAMP_ANSWERS` answers of that
dataset and lane are seen (so the first wave cannot overshoot: it once went 2-3x over, sent
whole at max_tokens/4 apiece), then the 90th percentile of the latest answers' lengths (a
mean let the long answers still running push it over). An attempt is sent only while spent +
reserved < budget, so the overshoot is bounded by what is in flight, and in practice a few
percent.
Dollar caps (per dataset and for the job) reserve the worst case of each attempt in flight:
max_tokens at the completion price plus an upper bound of the prompt's cost. Far from a cap
that reservation never binds; near it, fewer attempts fit, and no way the attempts in flight
can end takes the spend past the cap.

Holds. One rule serves every scope (the job, each dataset; dollars and tokens): a request that
may have been billed and whose bill is not known yet (one of a killed run, which OpenRouter
bills when its generation ends, after the client is gone; or one of this run cut short) holds
its worst case against every dollar cap and its expected tokens against its dataset's token
budget, like a request in flight, until its bill is found and counted in its place
(`holds.py` finds them). Only the job's own requests count: spend on a shared key that this
job's requests cannot explain never does.

Waiting. An attempt denied while requests in flight hold the room waits in the queue of its
dataset and lane. A settlement wakes the first waiter of each queue, and each attempt admitted
wakes the next of its queue, so waiters are tried as long as room is found. Waking them all at
every settlement made the last quarter of a capped run cost 10 s of CPU with 512 workers
waiting (each woke, was refused and slept again, at every answer: bench/compare.py's cap
round).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from regen.config import DatasetConfig, EndpointConfig
from regen.conversation import Usage
from regen.engine.gate import BILL_CEILING
from regen.errors import StateError
from regen.measures import quantile
from regen.state.db import Store
from regen.state.work import DatasetProgress

RAMP_ANSWERS = 16
"""Answers of a dataset and lane seen before its attempts are reserved less than max_tokens."""
LENGTH_WINDOW = 512
"""The latest answers whose lengths set the reservation."""


@dataclass(frozen=True, slots=True)
class Prices:
    """What an endpoint charges, in USD per token."""

    prompt: float
    completion: float
    usd_per_s: float = 0.0
    """A server priced by its time (self-hosted, by the GPU-hour): each answer is charged the
    time the server was busy with the job since the previous answer, so the answers' costs add
    up to its busy time at this rate. Such an attempt has no worst case of its own: a dollar
    cap stops sending once the charges reach it, and the requests then in flight add at most
    this rate times the time they take to finish."""
    floor: float = 0.0
    """The lowest completion price the model's catalogue lists (0: none read): a bill that
    claims less than a share of it for its completion tokens is no bill (`engine/gate.py`)."""
    cache_read: float | None = None
    """A prompt token read from the provider's cache (None: the prompt price)."""
    cache_write: float | None = None
    """A prompt token written to its cache where writes are billed apart (None: the prompt
    price; some providers charge more than it)."""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The worst case of a request of these tokens: every prompt token at the dearer of
        the prompt and cache write prices (a prompt may miss the cache, and a write may cost
        more than a plain prompt token): the leases and caps never count on a discount."""
        return prompt_tokens * self.prompt_worst + completion_tokens * self.completion

    @property
    def prompt_worst(self) -> float:
        """The most one prompt token can cost."""
        return max(self.prompt, self.cache_write or 0.0)

    def charge(self, usage: Usage) -> float:
        """What an answer costs at these prices, its cached and written prompt tokens at the
        cache prices (for answers without a bill of the provider's)."""
        cached, written = usage.cached_tokens, usage.cache_write_tokens
        plain = max(0, usage.prompt_tokens - cached - written)
        read = self.prompt if self.cache_read is None else self.cache_read
        write = self.prompt if self.cache_write is None else self.cache_write
        return (
            plain * self.prompt
            + cached * read
            + written * write
            + usage.completion_tokens * self.completion
        )

    def scaled(self, factor: float) -> Prices:
        def times(price: float | None) -> float | None:
            return None if price is None else price * factor

        return replace(
            self,
            prompt=self.prompt * factor,
            completion=self.completion * factor,
            cache_read=times(self.cache_read),
            cache_write=times(self.cache_write),
        )


REPRICE_TOLERANCE = 0.01
"""Bills above the known prices by more than this share raise them (rounding stays below)."""
REPRICED_META = "repriced"
"""state.db meta: per endpoint, the prices an answer was billed above and by how much."""
USD_RESOLUTION = 1e-9
"""Dollar amounts below this are float residue, not money."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Room reserved for one attempt in flight; settled exactly once."""

    dataset: str
    lane: str
    tokens: float
    """Expected tokens, held against the dataset's token budget."""
    worst_usd: float
    """The most the attempt can cost, held against the dollar caps."""
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Denial:
    """Why an attempt may not be sent now. `wait`: attempts in flight hold the room, so ask
    again when one settles; otherwise the budget is met. `stops_run`: the job's own cap.
    `dataset`: the room is the dataset's own (its token budget or dollar cap), so the lane's
    other datasets may still be sent meanwhile."""

    reason: str
    wait: bool = False
    stops_run: bool = False
    dataset: bool = False


@dataclass
class _Scope:
    """Spend, reservations and holds of one dataset, or of the whole job."""

    spent_tokens: int = 0
    spent_usd: float = 0.0
    reserved_tokens: float = 0.0
    reserved_usd: float = 0.0
    reserved_max_tokens: int = 0
    in_flight: int = 0
    bound_at_last_admission: int = 0
    """The max_tokens of everything in flight when the last attempt was admitted."""
    held: int = 0
    held_usd: float = 0.0
    held_tokens: float = 0.0
    awaited: int = 0
    """Of the held requests, those whose bills are looked up by generation id (they come
    within seconds); the others wait for their deadline (a lane timeout or more)."""
    """Requests that may have been billed and whose bill is not known yet (a killed run's, or
    this run's cut short): each holds its worst case against the dollar caps and its expected
    tokens against the token budget until its bill is found (`BudgetBook.hold`)."""

    @property
    def charged_usd(self) -> float:
        """What counts as spent against a dollar cap: the bills known."""
        return self.spent_usd

    def take(self, lease: Lease) -> None:
        self.reserved_tokens += lease.tokens
        self.reserved_usd += lease.worst_usd
        self.reserved_max_tokens += lease.max_tokens
        self.in_flight += 1
        self.bound_at_last_admission = self.reserved_max_tokens

    def give_back(self, lease: Lease) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:  # no float drift survives an idle moment
            self.reserved_tokens = self.reserved_usd = 0.0
            self.reserved_max_tokens = 0
        else:
            self.reserved_tokens -= lease.tokens
            self.reserved_usd -= lease.worst_usd
            self.reserved_max_tokens -= lease.max_tokens

    def hold(self, usd: float, tokens: float, awaited: bool) -> None:
        self.held += 1
        self.awaited += awaited
        self.held_usd += usd
        self.held_tokens += tokens

    @property
    def stuck(self) -> bool:
        """Nothing in flight, and no held bill expected soon: waiting for room here could
        take a lane timeout."""
        return not self.in_flight and not self.awaited

    def unhold(self, usd: float, tokens: float, awaited: bool) -> None:
        self.held -= 1
        self.awaited -= awaited
        if self.held == 0:
            self.held_usd = self.held_tokens = 0.0
        else:
            self.held_usd -= usd
            self.held_tokens -= tokens


@dataclass
class DatasetBudgetState:
    """A dataset's limits and where it stands against them."""

    token_budget: int | None
    max_cost_usd: float | None
    scope: _Scope = field(default_factory=_Scope)
    met: str | None = None
    """Why nothing more of this dataset is sent, once a budget is met."""
    held_out: bool = False
    """Its limit is met only with requests whose bills are not known yet (a killed run's):
    a later run may send what they leave (`held_words`)."""


class BudgetBook:
    """Spent and reserved tokens and dollars, per dataset and for the job; admits attempts."""

    def __init__(
        self,
        datasets: list[DatasetConfig],
        progress: list[DatasetProgress],
        *,
        job_max_cost_usd: float | None = None,
        count_total: bool = False,
        recent_lengths: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self._count_total = count_total
        self._job_cap = job_max_cost_usd
        self.job = _Scope(spent_usd=sum(p.cost_usd for p in progress))
        done = {p.name: p for p in progress}
        self.datasets: dict[str, DatasetBudgetState] = {}
        self._lengths: dict[tuple[str, str], tuple[deque[int], list[int]]] = {}
        """The latest completion lengths per (dataset, lane), in arrival order and sorted:
        the sorted copy is kept up to date one answer at a time, since sorting the window
        at every answer cost more than the rest of settling it."""
        self._p90: dict[tuple[str, str], float] = {}
        """Their 90th percentile, once RAMP_ANSWERS are in: `measures.quantile`, the report's
        rule too, interpolated and so never below the observed length under it (a reservation
        that errs high leaves fewer requests in flight to overshoot a budget)."""
        self._prior: dict[str, float] = {}
        """A dataset's p90 over its answers from earlier runs (a resumed dataset needs no
        ramp)."""
        for d in datasets:
            p = done.get(d.name)
            state = DatasetBudgetState(d.token_budget, d.max_cost_usd)
            if p is not None:
                state.scope.spent_tokens = self._tokens(p.prompt_tokens, p.completion_tokens)
                state.scope.spent_usd = p.cost_usd
                earlier = sorted((recent_lengths or {}).get(d.name, ()))
                if len(earlier) >= RAMP_ANSWERS:
                    self._prior[d.name] = quantile(earlier, 0.9)
            self.datasets[d.name] = state
            state.met = self._met_before_start(state)
        self.stopped: str | None = None
        self.key_lag_usd = 0.0
        """Room freed for the job that the credit limit of the key made for this run does not
        have yet (it is raised every few seconds): held against the job's cap meanwhile, so
        that nothing is sent that the provider would refuse."""
        self._waiting: dict[tuple[str, str], deque[asyncio.Future[None]]] = {}
        """Attempts denied while room is held, by (dataset, lane), first come first."""

    @property
    def needs_prices(self) -> bool:
        """Whether any dollar cap applies, so that every endpoint must have prices."""
        return self._job_cap is not None or any(
            s.max_cost_usd is not None for s in self.datasets.values()
        )

    @property
    def has_limits(self) -> bool:
        """Whether any budget or cap applies (else nothing needs holding)."""
        return self.needs_prices or any(s.token_budget is not None for s in self.datasets.values())

    def _tokens(self, prompt: int, completion: int) -> int:
        return prompt + completion if self._count_total else completion

    def counted_tokens(self, usage: Usage) -> int:
        """The tokens of an answer that count against token budgets."""
        return self._tokens(usage.prompt_tokens, usage.completion_tokens)

    def job_usd_left(self) -> float | None:
        """What the job's dollar cap allows beyond what is charged and held (None: no cap)."""
        if self._job_cap is None:
            return None
        return max(0.0, self._job_cap - self.job.charged_usd - self.job.held_usd)

    def tokens_spent(self, dataset: str) -> int:
        """The tokens the dataset's answers used, as its token budget counts them, over the
        whole job (earlier runs included)."""
        return self.datasets[dataset].scope.spent_tokens

    def left(self, dataset: str) -> tuple[float | None, float | None]:
        """What the dataset's token budget and dollar cap still allow (None: no limit),
        net of what the requests in flight are expected to use and what is held."""
        s = self.datasets[dataset]
        sc = s.scope
        tokens = usd = None
        if s.token_budget is not None:
            tokens = max(
                0.0, s.token_budget - sc.spent_tokens - sc.reserved_tokens - sc.held_tokens
            )
        if s.max_cost_usd is not None:
            usd = max(0.0, s.max_cost_usd - sc.charged_usd - sc.held_usd)
        if self._job_cap is not None:
            # The job's cap is shared: each dataset is bounded by what is left of it as if it
            # had it alone (an upper bound when several datasets run side by side).
            job = self.job
            room = self._job_cap - job.charged_usd - job.reserved_usd - job.held_usd
            usd = max(0.0, room) if usd is None else min(usd, max(0.0, room))
        return tokens, usd

    @staticmethod
    def _met_before_start(s: DatasetBudgetState) -> str | None:
        if s.token_budget is not None and s.scope.spent_tokens >= s.token_budget:
            return "token budget met"
        if s.max_cost_usd is not None and s.scope.spent_usd >= s.max_cost_usd:
            return "dollar cap met"
        return None

    def job_cap_met(self) -> bool:
        return self._job_cap is not None and self.job.charged_usd >= self._job_cap

    def expected_tokens(self, dataset: str, lane: str, max_tokens: int) -> float:
        """What an attempt is reserved under a token budget: the 90th percentile of the latest
        answers of the dataset in this lane, once RAMP_ANSWERS are seen (or of earlier runs'),
        else max_tokens."""
        p90 = self._p90.get((dataset, lane), self._prior.get(dataset))
        return float(max_tokens) if p90 is None else min(float(max_tokens), p90)

    def admit(
        self,
        dataset: str,
        lane: str,
        *,
        max_tokens: int,
        prompt_tokens_est: int,
        prompt_tokens_bound: Callable[[], int],
        prices: Prices | None,
    ) -> Lease | Denial:
        """A lease for one attempt, or why it may not be sent now. A budget is met when no
        outcome of what is in flight or held can make room for the attempt (the spend only
        grows); while some outcome could, the attempt waits."""
        if self.stopped is not None:
            return Denial(self.stopped, stops_run=True)
        state = self.datasets[dataset]
        if state.met is not None:
            return Denial(state.met)
        ds = state.scope
        tokens = self.expected_tokens(dataset, lane, max_tokens)
        if self._count_total:
            tokens += prompt_tokens_est
        denial = self._token_denial(state)
        if denial is not None:
            return denial
        worst = 0.0
        if state.max_cost_usd is not None or self._job_cap is not None:
            if prices is None:
                raise ValueError("a dollar cap needs the endpoint's prices")
            worst = prices.cost(prompt_tokens_bound(), max_tokens)
            denial = self._dollar_denial(state, worst)
            if denial is None:
                denial = self._job_dollar_denial(worst)
            if denial is not None:
                return denial
        lease = Lease(dataset, lane, tokens, worst, max_tokens)
        ds.take(lease)
        self.job.take(lease)
        # There may be room for the next waiter too: it tries, and if admitted wakes the next.
        self._wake_first(dataset, lane)
        return lease

    def _token_denial(self, state: DatasetBudgetState) -> Denial | None:
        """Why the dataset's token budget does not let one more attempt go now, if it does
        not: met by what is spent, or held by what is reserved and held."""
        ds = state.scope
        if state.token_budget is not None:
            if ds.spent_tokens >= state.token_budget:
                return self._meet(state, "token budget met")
            if ds.spent_tokens + ds.reserved_tokens + ds.held_tokens >= state.token_budget:
                if ds.stuck:
                    return self._hold_out(state, "token budget")
                return Denial(self._held_reason(ds, "token budget"), wait=True, dataset=True)
        return None

    def _dollar_denial(self, state: DatasetBudgetState, worst: float) -> Denial | None:
        """Why the dataset's dollar cap does not let an attempt that could cost `worst` go
        now, if it does not."""
        ds = state.scope
        cap = state.max_cost_usd
        if cap is not None:
            if ds.charged_usd + worst > cap:
                return self._meet(state, "dollar cap met")
            if ds.charged_usd + ds.reserved_usd + ds.held_usd + worst > cap:
                if ds.stuck:
                    return self._hold_out(state, "dollar cap")
                return Denial(self._held_reason(ds, "dollar cap"), wait=True, dataset=True)
        return None

    def _job_dollar_denial(self, worst: float) -> Denial | None:
        """Why the job's dollar cap does not let an attempt that could cost `worst` go now,
        if it does not: met, it stops the run."""
        job = self.job
        if self._job_cap is not None:
            if job.charged_usd + worst > self._job_cap:
                self.stopped = (
                    f"the job's dollar cap [budget].max_cost_usd = {self._job_cap:g} is met "
                    f"(${job.charged_usd:.4f} spent; the next request could cost up to "
                    f"${worst:.4f})"
                )
                self._notify(everyone=True)
                return Denial(self.stopped, stops_run=True)
            held = job.held_usd + self.key_lag_usd
            if job.charged_usd + job.reserved_usd + held + worst > self._job_cap:
                if job.stuck and self.key_lag_usd < USD_RESOLUTION:
                    # Only bills that come no sooner than their deadline (a lane timeout or
                    # more) stand between the job and its cap: stop rather than idle.
                    self.stopped = (
                        f"the job's dollar cap [budget].max_cost_usd = {self._job_cap:g} is "
                        f"met (${job.charged_usd:.4f} spent), {held_words(job)}"
                    )
                    self._notify(everyone=True)
                    return Denial(self.stopped, stops_run=True)
                return Denial(self._held_reason(job, "job dollar cap"), wait=True)
        return None

    @staticmethod
    def _held_reason(scope: _Scope, what: str) -> str:
        if scope.in_flight:
            return f"{what} held by requests in flight"
        if scope.held:
            return f"{what} held for requests whose bills are not known yet"
        return f"{what} held until the run's key's credit limit is raised"

    def _hold_out(self, state: DatasetBudgetState, what: str) -> Denial:
        """Only requests whose bills come no sooner than their deadline (a killed run's,
        without a generation id) stand between the dataset and its limit: nothing more of
        it is sent in this run, and the run says so as it does for the job's cap, in the
        same words, with the same exit code (`held_out`): not met, but held."""
        sc = state.scope
        state.held_out = True
        used = (
            f"{sc.spent_tokens} of {state.token_budget} tokens used"
            if what == "token budget"
            else f"${sc.charged_usd:.4f} of ${state.max_cost_usd:g} spent"
        )
        return self._meet(state, f"its {what} is met ({used}), {held_words(sc)}")

    def _meet(self, state: DatasetBudgetState, reason: str) -> Denial:
        state.met = reason
        self._notify(everyone=True)
        return Denial(reason)

    def settle(self, lease: Lease, usage: Usage | None) -> None:
        """Give the lease back, charging what the provider billed (None: not billed)."""
        state = self.datasets[lease.dataset]
        state.scope.give_back(lease)
        self.job.give_back(lease)
        if usage is not None:
            self._spend(lease.dataset, usage)
            key = (lease.dataset, lease.lane)
            window = self._lengths.get(key)
            if window is None:
                window = self._lengths[key] = (deque(), [])
            latest, ordered = window
            if len(latest) == LENGTH_WINDOW:
                del ordered[bisect.bisect_left(ordered, latest.popleft())]
            latest.append(usage.completion_tokens)
            bisect.insort(ordered, usage.completion_tokens)
            if len(ordered) >= RAMP_ANSWERS:
                self._p90[key] = quantile(ordered, 0.9)
        self._notify()

    def _spend(self, dataset: str | None, usage: Usage) -> None:
        cost = usage.cost_usd or 0.0
        state = self.datasets.get(dataset) if dataset is not None else None
        if state is not None:
            state.scope.spent_tokens += self._tokens(usage.prompt_tokens, usage.completion_tokens)
            state.scope.spent_usd += cost
        self.job.spent_usd += cost

    def hold(self, lease: Lease, *, awaited: bool = False) -> None:
        """An attempt may have been billed and its bill is not known yet: its lease becomes a
        hold (`release` ends it when the bill is known). `awaited`: its bill is looked up by
        generation id, so it comes within seconds."""
        state = self.datasets[lease.dataset]
        state.scope.give_back(lease)
        self.job.give_back(lease)
        state.scope.hold(lease.worst_usd, lease.tokens, awaited)
        self.job.hold(lease.worst_usd, lease.tokens, awaited)
        self._notify()

    def add_hold(
        self, dataset: str | None, usd: float, tokens: float, *, awaited: bool = False
    ) -> None:
        """Hold a request of an earlier run that may still be billed against every scope it
        belongs to (its dataset, if it is still in the job, and the job)."""
        state = self.datasets.get(dataset) if dataset is not None else None
        if state is not None:
            state.scope.hold(usd, tokens, awaited)
        self.job.hold(usd, tokens, awaited)

    def release(
        self,
        dataset: str | None,
        usd: float,
        tokens: float,
        usage: Usage | None,
        *,
        awaited: bool = False,
    ) -> None:
        """A held request's bill is known (`usage`; None: not billed): it counts as spent in
        place of its hold."""
        state = self.datasets.get(dataset) if dataset is not None else None
        if state is not None:
            state.scope.unhold(usd, tokens, awaited)
        self.job.unhold(usd, tokens, awaited)
        if usage is not None:
            self._spend(dataset, usage)
        self._notify()

    def key_caught_up(self, usd: float) -> None:
        """The run's key's credit limit now has `usd` more of the room freed for the job. What
        a float sum of many freed amounts leaves behind (1e-18 dollars) is no lag: counted as
        one, it kept a capped run waiting for its key forever."""
        self.key_lag_usd = max(0.0, self.key_lag_usd - usd)
        if self.key_lag_usd < USD_RESOLUTION:
            self.key_lag_usd = 0.0
        self._notify()

    @property
    def has_job_cap(self) -> bool:
        return self._job_cap is not None

    def _notify(self, *, everyone: bool = False) -> None:
        """Room may have changed: the first waiter of each queue tries again (`everyone`:
        all of them, when a budget is met or the job stops and every waiter must hear it)."""
        for key, queue in self._waiting.items():
            if everyone:
                while queue:
                    fut = queue.popleft()
                    if not fut.done():
                        fut.set_result(None)
            else:
                self._wake_first(*key)

    def _wake_first(self, dataset: str, lane: str) -> None:
        queue = self._waiting.get((dataset, lane))
        while queue:
            fut = queue.popleft()
            if not fut.done():  # a waiter that gave up (the run stopped) is cancelled
                fut.set_result(None)
                return

    def changed(self, dataset: str, lane: str) -> asyncio.Future[None]:
        """Wait for a turn to try admission again, after a denial "held by requests in
        flight". The place in the queue is taken now, not when the wait starts: a settlement
        between the denial and the first step of the wait (another task may run in between)
        then still wakes it. Taken late, it was lost, and a worker waited forever for a
        settlement that had already happened. Cancel the future to give the place up."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((dataset, lane), deque()).append(fut)
        return fut


def held_words(scope: _Scope) -> str:
    """How every scope (the job's cap, a dataset's cap or token budget) says that its room is
    held by requests whose bills cannot be seen yet."""
    usd = f"${scope.held_usd:.4f} and " if scope.held_usd > 0 else ""
    return (
        f"counting up to {usd}{scope.held_tokens:.0f} tokens held for {scope.held} requests "
        "whose bills cannot be seen yet: run again later to send what they leave"
    )


def fill_cost(usage: Usage, prices: Prices | None) -> Usage:
    """The usage with its cost: the provider's when it gave one, else from the prices (its
    cached and written prompt tokens at the cache prices, `Prices.charge`)."""
    if usage.cost_usd is not None or prices is None:
        return usage
    return replace(usage, cost_usd=prices.charge(usage))


def configured_prices(endpoint: EndpointConfig) -> Prices | None:
    """An endpoint's prices from its per-million-token fields, if both are given (with its
    cache prices, if given), or from its GPU-hour price."""
    if endpoint.usd_per_gpu_hour is not None:
        return Prices(0.0, 0.0, endpoint.usd_per_gpu_hour * endpoint.gpus / 3600)
    p, c = endpoint.prompt_usd_per_mtok, endpoint.completion_usd_per_mtok
    if p is None or c is None:
        return None
    read, write = endpoint.cache_read_usd_per_mtok, endpoint.cache_write_usd_per_mtok
    return Prices(
        p / 1e6,
        c / 1e6,
        cache_read=None if read is None else read / 1e6,
        cache_write=None if write is None else write / 1e6,
    )


def per_mtok(cost_usd: float, completion_tokens: int) -> float:
    """Effective dollars per million completion tokens (everything spent, over what came)."""
    return cost_usd / completion_tokens * 1e6 if completion_tokens else 0.0


def billed_above(prices: Prices | None, usage: Usage) -> float | None:
    """How many times the per-token prices an answer was billed, when more than they allow
    (beyond REPRICE_TOLERANCE); None otherwise, or when either is unknown."""
    if prices is None or usage.cost_usd is None:
        return None
    priced = prices.charge(usage)
    if priced <= 0 or usage.cost_usd <= priced * (1 + REPRICE_TOLERANCE):
        return None
    return usage.cost_usd / priced


def remember_prices(store: Store, endpoint: str, listed: Prices, factor: float) -> None:
    """Keep for the next runs that the endpoint's `listed` prices are billed `factor` times
    (prices changed since apply afresh). A write that fails (a full disk) is the commits' to
    report: the raise holds for this run all the same."""
    known = repriced_meta(store)
    known[endpoint] = {"prompt": listed.prompt, "completion": listed.completion, "factor": factor}
    with contextlib.suppress(StateError):
        store.set_meta(REPRICED_META, json.dumps(known, sort_keys=True))


def repriced_meta(store: Store) -> dict[str, dict[str, float]]:
    """What earlier runs learned of endpoints' prices from their bills (state.db is untrusted:
    anything but finite numbers, factors above 1 and at most the gate's BILL_CEILING, is
    ignored)."""
    try:
        raw = json.loads(store.get_meta(REPRICED_META) or "{}")
    except ValueError:
        return {}
    out: dict[str, dict[str, float]] = {}
    if not isinstance(raw, dict):
        return out
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        values = [entry.get(k) for k in ("prompt", "completion", "factor")]
        if (
            all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in values
            )
            and 1.0 < entry["factor"] <= BILL_CEILING
        ):
            out[str(name)] = {k: float(entry[k]) for k in ("prompt", "completion", "factor")}
    return out


def learned_prices(
    prices: dict[str, Prices | None], store: Store
) -> tuple[dict[str, Prices | None], dict[str, float]]:
    """The endpoints' prices raised to what earlier runs' answers were billed at, where the
    prices are still those the bills were compared with; and the factors applied."""
    known = repriced_meta(store)
    out = dict(prices)
    factors: dict[str, float] = {}
    for name, p in prices.items():
        entry = known.get(name)
        if p is None or entry is None or p.usd_per_s:
            continue
        if math.isclose(p.prompt, entry["prompt"], rel_tol=1e-6, abs_tol=1e-15) and math.isclose(
            p.completion, entry["completion"], rel_tol=1e-6, abs_tol=1e-15
        ):
            out[name] = p.scaled(entry["factor"])
            factors[name] = entry["factor"]
    return out, factors


def budget_lines(book: BudgetBook) -> list[str]:
    """One line per dataset with a budget: what it used, and the overshoot when met."""
    lines = []
    for name, s in book.datasets.items():
        used = s.scope.spent_tokens
        if s.token_budget is not None:
            over = used - s.token_budget
            line = f"dataset {name}: token budget {s.token_budget}: used {used}"
            if s.met == "token budget met" and over > 0:
                if s.scope.bound_at_last_admission:
                    line += (
                        f", {over} over ({over / s.token_budget:.1%}; bound: "
                        f"{s.scope.bound_at_last_admission}, the max_tokens of the "
                        "requests in flight at the last admission)"
                    )
                else:
                    line += f", {over} over ({over / s.token_budget:.1%}, in an earlier run)"
            lines.append(line + (f"; {s.met}" if s.met else ""))
        if s.max_cost_usd is not None:
            lines.append(
                f"dataset {name}: dollar cap {s.max_cost_usd:g}: spent "
                f"${s.scope.spent_usd:.4f}" + (f"; {s.met}" if s.met else "")
            )
    return lines
