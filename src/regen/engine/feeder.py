"""The feeder: pending items claimed from the store in dispatch order into each lane's queue,
as its workers take them, until the lane's datasets are sent, held back (a budget met, a
pilot sent) or the run stops.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from regen import failpoints
from regen.engine.budget import BudgetBook
from regen.engine.commits import CommitBuffer
from regen.state.db import Store
from regen.state.work import PendingItem

if TYPE_CHECKING:
    from regen.engine.scheduler import LaneRuntime, RunStats


class Feeder:
    """What each dataset has had handed out in this run, and which escalated items went out."""

    def __init__(
        self,
        store: Store,
        lanes: dict[str, LaneRuntime],
        stats: RunStats,
        commits: CommitBuffer,
        *,
        stopping: asyncio.Event,
        lane_done: dict[str, asyncio.Event],
        budget: BudgetBook | None = None,
        pilot: int | None = None,
        sequential: set[str],
    ) -> None:
        self._store = store
        self._lanes = lanes
        self._stats = stats
        self._commits = commits
        self._stopping = stopping
        self._lane_done = lane_done
        """Set when a lane's workers are all done (it escalates nothing more)."""
        self._budget = budget
        self._pilot = pilot
        self._sequential = sequential
        """Datasets in sequential mode: their turns wait for the previous turn's answer."""
        self._fed: Counter[str] = Counter()
        self._escalated_sent: set[str] = set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def feed(self, lane: LaneRuntime, queue: asyncio.Queue[PendingItem | None]) -> None:
        """Fill the lane's queue with its pending items, then one None per worker."""
        batch_size = max(64, min(2 * lane.concurrency, 4096))
        # Items escalated to this lane go out as they come, beside the lane's own datasets: a
        # sequential turn of this lane may wait for one of them.
        escalated = asyncio.create_task(self._feed_escalated(lane, queue, batch_size))
        try:
            for name in lane.datasets:
                after = -1
                failpoints.reached("dataset", name)
                while not self.stopping and not self._held_back(name):
                    batch = self._store.work.claim_batch(name, after, batch_size, lane=lane.name)
                    if not batch:
                        break
                    for item in batch:
                        if self.stopping or self._held_back(name):
                            break
                        await self._put(queue, item)
                    after = batch[-1].order_key
                await self._feed_waiting(lane, queue, name, batch_size)
            await escalated
        finally:
            escalated.cancel()
        for _ in range(lane.concurrency):
            await queue.put(None)

    async def _feed_escalated(
        self, lane: LaneRuntime, queue: asyncio.Queue[PendingItem | None], batch_size: int
    ) -> None:
        """Items escalated to this lane arrive while the lanes that send them still run.
        Pass over them in pages (those already handed out are skipped, and on a wide lane
        they fill whole pages) until a pass that began after those lanes finished finds
        nothing new."""
        sources = [s for s in self._lanes.values() if s.escalate_to == lane.name]
        cursor: tuple[int, str] | None = None
        sources_done = fed = False
        while sources and not self.stopping:
            if cursor is None:  # a new pass
                sources_done = all(self._lane_done[s.name].is_set() for s in sources)
                self._commits.flush()
                fed = False
            page = self._store.work.claim_escalated(lane.name, batch_size, after=cursor)
            for item in page:
                if item.id not in self._escalated_sent:
                    self._escalated_sent.add(item.id)
                    fed = True
                    await queue.put(item)
            if len(page) == batch_size:
                cursor = (page[-1].order_key, page[-1].id)
                continue
            cursor = None
            if not fed:
                if sources_done:
                    return
                await asyncio.sleep(0.2)

    async def _put(self, queue: asyncio.Queue[PendingItem | None], item: PendingItem) -> None:
        self._fed[item.dataset] += 1
        if item.dataset in self._sequential:
            self._commits.handed_out(item)
        await queue.put(item)

    async def _feed_waiting(
        self,
        lane: LaneRuntime,
        queue: asyncio.Queue[PendingItem | None],
        name: str,
        batch_size: int,
    ) -> None:
        """Sequential mode: a turn becomes ready when the previous turn's answer is committed.
        Rescan for ready turns until none waits, leaving out those already handed out."""
        if name not in self._sequential:
            return
        scanned_at = -1
        while not self.stopping and not self._held_back(name):
            if self._commits.recorded(name) == scanned_at:
                # Nothing of this dataset finished since the last scan: nothing new is ready.
                await asyncio.sleep(self._commits.interval_s)
                continue
            self._commits.flush()
            if self._commits.unsaved:
                # The commit failed: the store does not yet know what finished.
                await asyncio.sleep(0.5)
                continue
            scanned_at = self._commits.recorded(name)
            after, fed = -1, 0
            while True:
                batch = self._store.work.claim_batch(name, after, batch_size, lane=lane.name)
                if not batch:
                    break
                claimed_at = self._commits.commits
                for item in batch:
                    if self._commits.uncommitted(item.id):
                        continue
                    # Handing out the batch waits on the queue, and meanwhile an earlier scan's
                    # turn may have been answered and committed: the claim is stale then.
                    if self._commits.commits != claimed_at and not self._store.work.is_pending(
                        item.id
                    ):
                        continue
                    if self.stopping or self._held_back(name):
                        return
                    await self._put(queue, item)
                    fed += 1
                after = batch[-1].order_key
            in_flight = self._commits.in_flight(name)
            # A turn escalated to another lane unblocks the next turn when it is done there.
            in_flight = in_flight or self._store.work.escalated_pending(name) > 0
            if not fed and not in_flight:
                # Nothing in flight can unblock the rest: their earlier turns failed.
                return
            # A scan walks every pending item of the dataset, and a turn becomes ready only
            # when its predecessor is committed: scan at most once a commit interval.
            await asyncio.sleep(self._commits.interval_s)

    def _held_back(self, dataset: str) -> bool:
        """Nothing more of this dataset goes out: its budget is met, or its pilot is sent."""
        if self._pilot is not None:
            done = self._stats.datasets[dataset].done_before
            if self._fed[dataset] >= self._pilot - done:
                return True
        return self._budget is not None and self._budget.datasets[dataset].met is not None
