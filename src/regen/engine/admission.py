"""An item's next attempt, admitted: a server of its lane picked once one is up, a slot of
that server's adaptive limit and, under budgets, a lease on the caps, and the request written
to `outstanding` before it goes when it may be billed after its client is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from regen.conversation import Request, prompt_tokens_bound
from regen.engine.attempt import DEFERRED, Deferred, Tally, Try
from regen.engine.budget import BudgetBook, Lease
from regen.engine.commits import CommitBuffer
from regen.engine.feeder import Feeder, until_set
from regen.engine.holds import HoldKeeper
from regen.engine.limiter import AdaptiveLimit
from regen.engine.runtime import EndpointRuntime, LaneRuntime
from regen.engine.sent_log import SentLog
from regen.engine.servers import ServerPool
from regen.state.work import PendingItem

if TYPE_CHECKING:
    from regen.engine.stats import RunStats


class Admission:
    """Admits attempts (the pool's server, its limit's slot, the budget's lease, the sent log)
    and settles what they took once their request ends."""

    def __init__(
        self,
        stats: RunStats,
        pool: ServerPool,
        budget: BudgetBook | None,
        sent_log: SentLog,
        feeder: Feeder,
        commits: CommitBuffer,
        keeper: HoldKeeper | None,
        *,
        stopping: asyncio.Event,
        stop: Callable[..., None],
    ) -> None:
        self._stats = stats
        self._pool = pool
        self._budget = budget
        self._sent_log = sent_log
        self._feeder = feeder
        self._commits = commits
        self._keeper = keeper
        self._stopping = stopping
        self._stop = stop

    async def admit(
        self, lane: LaneRuntime, item: PendingItem, req: Request, tally: Tally, *, defer: bool
    ) -> Try | Deferred | None:
        """The item's next attempt, admitted: an endpoint of the lane picked once one is up, a
        slot of its limit and, under budgets, a lease taken (`_slot_and_lease`), and the request
        recorded in `outstanding` when it may be billed after its client is gone. None: it is
        not sent (the run stops, a budget is met, or state.db cannot be written); DEFERRED
        (`defer`): set aside while its dataset's room is held by requests in flight."""
        if not await self._pool.back(lane):  # every server of the lane is down
            return None
        tally.number += 1
        ep = self._pool.pick(lane, item.conversation_id)
        limit = lane.limits[ep.name]
        ep.took(item.conversation_id)
        try:
            admitted = await self._slot_and_lease(
                lane, ep, limit, item, req, defer=defer, retry=tally.number > 1
            )
        except BaseException:
            ep.gave_back(item.conversation_id)
            raise
        if admitted is None or admitted is DEFERRED:
            ep.gave_back(item.conversation_id)
            if admitted is DEFERRED:
                tally.number -= 1
            return admitted
        lease, epoch = admitted
        if lease is not None and lease.worst_usd > 0:
            self._stats.lanes[lane.name].worst_usd.append(lease.worst_usd)
        att = Try(tally.number, ep, limit, epoch, lease)
        if lease is not None and ep.billed_after_gone and self._budget is not None:
            att.sent = self._sent_log.sent(
                lease, item, lane=lane.name, endpoint=ep.name, total_s=lane.timeouts.total_s
            )
            if not await self._sent_log.record():
                # Not recorded, so not sent: state.db cannot be written (the run stops).
                self._budget.settle(lease, None)
                limit.release("other", epoch=epoch)
                ep.gave_back(item.conversation_id)
                return None
        return att

    async def _slot_and_lease(
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
            if self._stopping.is_set():
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
                    self._stop(decision.reason, budget=True)
                return None
            if defer and decision.dataset:
                self._feeder.defer(lane.name, item)
                return DEFERRED
            why = f"{item.dataset}: {decision.reason}" if decision.dataset else decision.reason
            waiting = self._stats.lanes[lane.name].waiting
            waiting[why] += 1
            try:
                await until_set(self._budget.changed(item.dataset, lane.name), self._stopping)
            finally:
                waiting[why] -= 1
                if not waiting[why]:
                    del waiting[why]

    def settle(self, att: Try) -> None:
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
        kept = sent is not None and att.end == "maybe_billed" and self._keeper is not None
        self._budget.hold(lease, awaited=kept and att.begun is not None)
        if kept and sent is not None and self._keeper is not None:
            if att.begun is not None:
                sent = replace(sent, generation_id=att.begun)
            self._keeper.add(sent)
