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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from regen.config import DatasetConfig, EndpointConfig
from regen.conversation import Usage
from regen.store import DatasetProgress

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

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


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
    again when one settles; otherwise the budget is met. `stops_run`: the job's own cap."""

    reason: str
    wait: bool = False
    stops_run: bool = False


@dataclass
class _Scope:
    """Spend and reservations of one dataset, or of the whole job."""

    spent_tokens: int = 0
    spent_usd: float = 0.0
    uncertain_usd: float = 0.0
    """The worst cases of attempts that may have been billed without a bill regen can see (a
    timeout before any answer came): counted as spent against dollar caps."""
    reserved_tokens: float = 0.0
    reserved_usd: float = 0.0
    reserved_max_tokens: int = 0
    in_flight: int = 0
    bound_at_last_admission: int = 0
    """The max_tokens of everything in flight when the last attempt was admitted."""

    @property
    def charged_usd(self) -> float:
        """What counts as spent against a dollar cap."""
        return self.spent_usd + self.uncertain_usd

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


@dataclass
class DatasetBudgetState:
    """A dataset's limits and where it stands against them."""

    token_budget: int | None
    max_cost_usd: float | None
    scope: _Scope = field(default_factory=_Scope)
    met: str | None = None
    """Why nothing more of this dataset is sent, once a budget is met."""


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
        """Their 90th percentile, once RAMP_ANSWERS are in."""
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
                    self._prior[d.name] = float(earlier[int(0.9 * (len(earlier) - 1))])
            self.datasets[d.name] = state
            state.met = self._met_before_start(state)
        self.stopped: str | None = None
        self._waiting: dict[tuple[str, str], deque[asyncio.Future[None]]] = {}
        """Attempts denied while room is held, by (dataset, lane), first come first."""
        self.unrecorded_usd = 0.0
        """Billed by the provider beyond the ledger, counted against the job's cap."""
        self.dead_usd = 0.0
        """Held for requests of a killed run that may still be billed (`hold_dead`)."""

    @property
    def needs_prices(self) -> bool:
        """Whether any dollar cap applies, so that every endpoint must have prices."""
        return self._job_cap is not None or any(
            s.max_cost_usd is not None for s in self.datasets.values()
        )

    def _tokens(self, prompt: int, completion: int) -> int:
        return prompt + completion if self._count_total else completion

    def counted_tokens(self, usage: Usage) -> int:
        """The tokens of an answer that count against token budgets."""
        return self._tokens(usage.prompt_tokens, usage.completion_tokens)

    def left(self, dataset: str) -> tuple[float | None, float | None]:
        """What the dataset's token budget and dollar cap still allow (None: no limit),
        net of what the requests in flight are expected to use."""
        s = self.datasets[dataset]
        tokens = usd = None
        if s.token_budget is not None:
            tokens = max(0.0, s.token_budget - s.scope.spent_tokens - s.scope.reserved_tokens)
        if s.max_cost_usd is not None:
            usd = max(0.0, s.max_cost_usd - s.scope.charged_usd)
        if self._job_cap is not None:
            # The job's cap is shared: each dataset is bounded by what is left of it as if it
            # had it alone (an upper bound when several datasets run side by side).
            job = max(0.0, self._job_cap - self.job.charged_usd - self.job.reserved_usd)
            usd = job if usd is None else min(usd, job)
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
        """A lease for one attempt, or why it may not be sent now."""
        if self.stopped is not None:
            return Denial(self.stopped, stops_run=True)
        state = self.datasets[dataset]
        if state.met is not None:
            return Denial(state.met)
        ds = state.scope
        tokens = self.expected_tokens(dataset, lane, max_tokens)
        if self._count_total:
            tokens += prompt_tokens_est
        if state.token_budget is not None:
            if ds.spent_tokens >= state.token_budget:
                return self._meet(state, "token budget met")
            if ds.spent_tokens + ds.reserved_tokens >= state.token_budget:
                return Denial("token budget held by requests in flight", wait=True)
        worst = 0.0
        if state.max_cost_usd is not None or self._job_cap is not None:
            if prices is None:
                raise ValueError("a dollar cap needs the endpoint's prices")
            worst = prices.cost(prompt_tokens_bound(), max_tokens)
            if state.max_cost_usd is not None and (
                ds.charged_usd + ds.reserved_usd + worst > state.max_cost_usd
            ):
                if ds.in_flight == 0:
                    return self._meet(state, "dollar cap met")
                return Denial("dollar cap held by requests in flight", wait=True)
            if self._job_cap is not None and (
                self.job.charged_usd + self.job.reserved_usd + worst > self._job_cap
            ):
                held = self.job.charged_usd - self.dead_usd + self.job.reserved_usd + worst
                if self.dead_usd > 0 and held <= self._job_cap:
                    # Not met: held for a killed run's requests, which will be billed or over.
                    return Denial("job dollar cap held for a killed run's requests", wait=True)
                if self.job.in_flight == 0:
                    self.stopped = (
                        f"the job's dollar cap [budget].max_cost_usd = {self._job_cap:g} is met "
                        f"(${self.job.charged_usd:.4f} spent or possibly spent; the next "
                        f"request could cost up to ${worst:.4f})"
                    )
                    self._notify(everyone=True)
                    return Denial(self.stopped, stops_run=True)
                return Denial("job dollar cap held by requests in flight", wait=True)
        lease = Lease(dataset, lane, tokens, worst, max_tokens)
        ds.take(lease)
        self.job.take(lease)
        # There may be room for the next waiter too: it tries, and if admitted wakes the next.
        self._wake_first(dataset, lane)
        return lease

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
            cost = usage.cost_usd or 0.0
            state.scope.spent_tokens += self._tokens(usage.prompt_tokens, usage.completion_tokens)
            state.scope.spent_usd += cost
            self.job.spent_usd += cost
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
                self._p90[key] = float(ordered[int(0.9 * (len(ordered) - 1))])
        self._notify()

    def hold(self, lease: Lease) -> None:
        """An attempt may have been billed, and its bill cannot be known: give its lease back
        but count its worst case as spent against the dollar caps for the rest of the run."""
        self.datasets[lease.dataset].scope.uncertain_usd += lease.worst_usd
        self.job.uncertain_usd += lease.worst_usd
        self.settle(lease, None)

    def count_unrecorded(self, usd: float) -> None:
        """Spend the provider reports beyond the ledger (answers lost to a crash, say): it
        counts against the job's cap, since no dataset can be told."""
        self.job.uncertain_usd += max(0.0, usd)
        self.unrecorded_usd += max(0.0, usd)

    @property
    def has_job_cap(self) -> bool:
        return self._job_cap is not None

    @property
    def exposure_usd(self) -> float:
        """What requests of this run may still add to the provider's bill beyond the ledger:
        the worst cases in flight and the holds of attempts whose bill is unknown (not what it
        holds for killed runs). A run that is killed leaves this for the next to hold."""
        return self.job.reserved_usd + self.job.uncertain_usd - self.unrecorded_usd - self.dead_usd

    def hold_dead(self, usd: float) -> None:
        """Hold what a killed run's requests may still be billed (their worst cases, as it
        recorded them) against the job's cap: OpenRouter bills an answer when its generation
        ends, after the client that asked for it is gone."""
        self.dead_usd += usd
        self.job.uncertain_usd += usd
        self._notify()

    def release_dead(self, usd: float, newly_unrecorded: float) -> None:
        """A killed run's requests are over: count what the provider billed beyond the ledger
        since, in place of their worst cases."""
        usd = min(usd, self.dead_usd)
        self.job.uncertain_usd -= usd
        self.dead_usd -= usd
        self.count_unrecorded(newly_unrecorded)
        self._notify()

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

    def report(self) -> list[str]:
        """One line per dataset with a budget: what it used, and the overshoot when met."""
        lines = []
        for name, s in self.datasets.items():
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
        if self.job.uncertain_usd > 0:
            lines.append(
                f"job: up to ${self.job.uncertain_usd:.4f} counted as spent for attempts that "
                "may have been billed without a bill in sight (timeouts, cut connections, or "
                "spend the provider reports beyond the ledger)"
            )
        return lines


def fill_cost(usage: Usage, prices: Prices | None) -> Usage:
    """The usage with its cost: the provider's when it gave one, else from the prices."""
    if usage.cost_usd is not None or prices is None:
        return usage
    return replace(usage, cost_usd=prices.cost(usage.prompt_tokens, usage.completion_tokens))


def configured_prices(endpoint: EndpointConfig) -> Prices | None:
    """An endpoint's prices from its per-million-token fields, if both are given, or from its
    GPU-hour price."""
    if endpoint.usd_per_gpu_hour is not None:
        return Prices(0.0, 0.0, endpoint.usd_per_gpu_hour * endpoint.gpus / 3600)
    p, c = endpoint.prompt_usd_per_mtok, endpoint.completion_usd_per_mtok
    return None if p is None or c is None else Prices(p / 1e6, c / 1e6)
