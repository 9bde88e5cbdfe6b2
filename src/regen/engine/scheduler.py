"""Dispatch: lanes of workers pull pending items lazily, send them through an adaptive limit per
endpoint, retry by failure class, commit outcomes in groups, and stop gracefully.

Only the items in flight live in memory: each lane has a fixed pool of `concurrency` workers
reading from a small queue that a feeder fills from the store in dispatch order. No task is
created per item.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from regen import failpoints
from regen.config import RunConfig
from regen.conversation import (
    Charge,
    Conversation,
    Outcome,
    Request,
    Result,
    Usage,
)
from regen.engine.admission import Admission
from regen.engine.attempt import (
    DEFERRED,
    LIMIT_SIGNALS,
    Retry,
    Tally,
    Try,
    Verdicts,
    backoff_s,
    off_wire,
    on_wire,
)
from regen.engine.budget import BudgetBook
from regen.engine.client.body import sent_settings
from regen.engine.commits import CommitBuffer
from regen.engine.eta import EARLIER_RSD, UNMEASURED_RSD
from regen.engine.failures import ClientErrorJudge, ErrorRate
from regen.engine.feeder import Feeder, LaneQueue, until_set
from regen.engine.holds import HoldKeeper
from regen.engine.limiter import AdaptiveLimit
from regen.engine.pricing import Pricing
from regen.engine.runtime import LaneRuntime
from regen.engine.sent_log import SentLog
from regen.engine.servers import ServerPool
from regen.engine.stats import (
    EndpointStats,
    LaneStats,
    RunStats,
)
from regen.errors import EndpointError, StateGone
from regen.sources.modes import build_request
from regen.state.db import Store
from regen.state.outstanding import CutShort
from regen.state.work import PendingItem

BILL_WAIT_S = 21.0
"""At the end of a run, how long this run's cut-short requests are looked up (their records
lag the answers) before they are left in `outstanding` for the next run."""


def completion_tokens(usage: Usage) -> int:
    """What a flow counts of an answer without budgets: its completion tokens."""
    return usage.completion_tokens


def seed_stats(
    stats: RunStats,
    lanes: list[LaneRuntime],
    run: RunConfig,
    store: Store,
    counted: Callable[[Usage], int],
) -> None:
    """A run's statistics before its first request: each lane's limits per endpoint, and each
    flow's items left, with what earlier runs measured (their answers' times and costs, the
    requests a kill cut short, the pace they ran at, the budget's tokens they used by
    `counted`), so that the ETA rests on them at once."""
    for lane in lanes:
        for ep in lane.endpoints:
            lane.limits[ep.name] = AdaptiveLimit(
                lane.concurrency, run.initial_limit, adaptive=run.adaptive
            )
            ep_stats = stats.endpoints.setdefault(ep.name, EndpointStats(ep.health))
            ep_stats.limits.append(lane.limits[ep.name])
        stats.lanes[lane.name] = LaneStats(
            lane.concurrency,
            list(lane.limits.values()),
            datasets=list(lane.datasets),
            escalate_to=lane.escalate_to,
        )
    pending = store.work.pending_flows()
    for (lane_name, ds), (n, est) in pending.items():
        if lane_name in stats.lanes:
            flow = stats.lanes[lane_name].flow(ds)
            flow.remaining += n
            flow.prompts_left += est
    # Earlier runs' answers (a pilot's) start each flow's latencies, so that the ETA rests
    # on a dataset's own times from the start, not on the datasets that happen to go first.
    for (lane_name, ds), answers in store.spend.earlier_latencies().items():
        if lane_name in stats.lanes:
            n, est = pending.get((lane_name, ds), (0, 0))
            stats.lanes[lane_name].flow(ds).start_from(answers, n, est)
    for (lane_name, ds), ages in store.outstanding.cut_short().items():
        if lane_name in stats.lanes:
            stats.lanes[lane_name].flow(ds).cut_short.extend(ages)
    seed_paces(stats, store)
    for (lane_name, ds), priced in store.spend.earlier_costs().items():
        if lane_name in stats.lanes:
            flow = stats.lanes[lane_name].flow(ds)
            for est, usd in reversed(priced):
                flow.add_priced(est, usd)
    for (lane_name, ds), earlier in store.spend.lane_answers().items():
        if lane_name in stats.lanes:
            flow = stats.lanes[lane_name].flow(ds)
            flow.answered += earlier.answered
            flow.escalated += earlier.escalated
            flow.earlier_cost_usd += earlier.cost_usd
            flow.earlier_tokens += counted(Usage(earlier.prompt_tokens, earlier.completion_tokens))


def seed_paces(stats: RunStats, store: Store) -> None:
    """What earlier runs say of each lane's pace, for the ETA until this run measures its own:
    the latest run's mean on the wire, and where its provider refused requests for capacity,
    what the plan expects it to keep on the wire (`LaneCapacity.on_wire`)."""
    for lane_name, pace in store.runs.earlier_on_wire().items():
        if lane_name in stats.lanes:
            stats.lanes[lane_name].wire.earlier = pace
    for lane_name, capacity in store.runs.lane_capacity().items():
        if lane_name in stats.lanes:
            wire = stats.lanes[lane_name].wire
            wire.ceiling = capacity.on_wire()
            wire.ceiling_rsd = EARLIER_RSD if capacity.run_measured else UNMEASURED_RSD


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
        self._run_id = run_id
        self._budget = budget
        self.keeper = keeper
        """Finds the bills of held requests (None: nothing is held, as without budgets)."""
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
        counted = budget.counted_tokens if budget is not None else completion_tokens
        self._build_steps(store, budget, keeper, pilot, set(sequential), counted)
        seed_stats(stats, lanes, run, store, counted)
        if budget is not None:
            self.stats.budget_left = budget.left
            self.stats.tokens_spent = budget.tokens_spent
            self.stats.job_usd_left = budget.job_usd_left

    def _build_steps(
        self,
        store: Store,
        budget: BudgetBook | None,
        keeper: HoldKeeper | None,
        pilot: Mapping[str, int] | None,
        sequential: set[str],
        counted: Callable[[Usage], int],
    ) -> None:
        """The parts an item goes through: the feeder fills the lanes' queues; an attempt is
        admitted (a server of the pool, a slot, a lease), priced, and judged (`Verdicts`, which
        counts an answer's tokens against the budgets by `counted`)."""
        self._feeder = Feeder(
            store,
            self._lanes,
            self.stats,
            self._commits,
            stopping=self._stopping,
            lane_done=self._lane_done,
            budget=budget,
            pilot=pilot,
            sequential=sequential,
        )
        self._pool = ServerPool(
            self.stats,
            self._run,
            self._rng,
            sleep=self._sleep,
            stopping=self._stopping,
            stop=self.stop,
        )
        self._verdicts = Verdicts(
            self.stats,
            self._run,
            self._commits,
            self._error_rate,
            counted_tokens=counted,
            drain=self._pool.drain,
            stopping=self._stopping,
            stop=self.stop,
        )
        self._pricing = Pricing(self.stats, store)
        self._admission = Admission(
            self.stats,
            self._pool,
            budget,
            self._sent_log,
            self._feeder,
            self._commits,
            keeper,
            stopping=self._stopping,
            stop=self.stop,
        )

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
            rest = tasks + workers + list(self._pool.probes) + ([keeping] if keeping else [])
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
            try:
                outcome = await self._process(lane, item)
            finally:  # set aside, or ended unsent: its conversation's next turns need not wait
                self._feeder.attempt_ended(lane.name, item)
            if outcome is not None:  # None: set aside until its dataset's budget has room
                self._record(lane, outcome, item.prompt_tokens_est)

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
                att = await self._admission.admit(lane, item, req, tally, defer=deferrable)
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
            step = self._verdicts.classify_error(lane, item, att, tally, exc)
            if isinstance(step, Retry):
                att.limit.release(signal, epoch=att.epoch, retry_after_s=exc.retry_after_s)
                signal = "released"
            return step
        finally:
            if signal != "released":
                att.limit.release(signal, epoch=att.epoch, latency_s=latency)
            # The provider has computed its prompt (or will not): its conversation's next
            # turns go (Feeder.attempt_ended; only a leader's first attempt matters).
            self._feeder.attempt_ended(lane.name, item)
        return self._verdicts.classify_answer(lane, item, att, tally, result)

    async def _send(self, lane: LaneRuntime, item: PendingItem, req: Request, att: Try) -> Result:
        """Send an admitted attempt's request and price its answer, or raise its EndpointError.
        However it ends, the request comes off the wire's counts (`off_wire`) and its lease
        is settled or held (`_settle`)."""
        ep = att.ep
        flow = on_wire(self.stats, lane, item, att)
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
            result = replace(
                self._pricing.price(ep, item, result, lane, req, att), settings=settings
            )
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
            off_wire(self.stats, lane, item, att, flow)
            if att.end == "cut":  # its answer, had it come, took at least this long
                elapsed = time.monotonic() - att.t0
                self._commits.cut(CutShort(self._run_id, item.id, item.dataset, lane.name, elapsed))
            self._admission.settle(att)
            # What the client learned of its server (a refused field, `n` ignored): said once.
            learned = getattr(ep.sender, "learned", None)
            while learned:
                self.stats.gate.say(learned.pop(0))

    async def _before_retry(self, retry: Retry) -> bool:
        """Wait before an item's next attempt. False: the run stopped meanwhile."""
        if retry.failover:  # straight to another server, or one that comes back (`ServerPool.back`)
            return True
        await self._backoff(backoff_s(retry.tries, retry.retry_after_s, self._rng))
        return not self.stopping

    def settle_held(self, charge: Charge | None, key: int) -> None:
        """A held request's bill (None: not billed) goes to the ledger with the next commit,
        and the request leaves `outstanding` in the same transaction."""
        if charge is not None:
            self._commits.charge(charge)
            if charge.dataset in self.stats.datasets:
                self.stats.datasets[charge.dataset].charge(charge.usage)
        self._commits.settle(key)

    async def _backoff(self, seconds: float) -> None:
        """Sleep, but wake at once when the run stops."""
        await self._until_stop(self._sleep(seconds))

    async def _until_stop(self, waiting: Awaitable[Any]) -> None:
        """Wait for something, but wake at once when the run stops."""
        await until_set(waiting, self._stopping)

    def _record(self, lane: LaneRuntime, outcome: Outcome, prompt_est: int) -> None:
        """An item's outcome, weighed by the judge of client errors, counted and buffered for
        the next commit."""
        outcome, suspect = self._judge.weigh(outcome)
        self._verdicts.count(lane, outcome, prompt_est=prompt_est, suspect=suspect)

    def flush(self) -> None:
        """Commit what finished now, rather than at the next tick."""
        self._commits.flush()
