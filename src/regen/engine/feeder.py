"""The feeder: pending items claimed from the store in dispatch order into each lane's queue,
as its workers take them, until the lane's datasets are sent, held back (a budget met, a
pilot sent) or the run stops.

A dataset whose budget is held only by its requests in flight (its room reserved, not met) does
not hold up the lane: the worker that was refused sets the item aside here (`defer`) and takes
the next one, and the lane's free slots take the next dataset's items meanwhile. The dataset is
then probed one item at a time, each time its budget changes: an item admitted lets the next
one go, an item refused again waits for the next change. Its set-aside items keep their place:
the lane's queue hands out items by rank, escalated items first (their answers were cut short
once), then the lane's datasets in dispatch order, so an item let back in goes before the next
dataset's. Without this, a token-budgeted dataset's last requests held every slot of the lane
idle until they returned (12-20 s of a 2-minute run in bench/plan.py's lanes workload).

A conversation's later items wait for its first one (`_Followers`): a provider's prefix cache
holds a prompt only once the request that wrote it is computed, so turns of one conversation
sent at the same moment each pay their whole history (issue 50).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from regen import failpoints
from regen.engine.budget import BudgetBook
from regen.engine.client.batch import SampleBatcher
from regen.engine.commits import CommitBuffer
from regen.state.db import Store
from regen.state.work import PendingItem

if TYPE_CHECKING:
    from regen.engine.runtime import LaneRuntime
    from regen.engine.stats import RunStats

ESCALATED_RANK = 0
"""The rank of escalated items in a lane's queue: before the lane's own datasets (1, 2, ...)."""
LAST_RANK = 1 << 30
"""The rank of the end marker each worker takes last."""


async def until_set(waiting: Awaitable[object], event: asyncio.Event) -> None:
    """Wait for something, but wake at once when `event` is set (the run stops); what was
    waited for is cancelled if it has not happened."""
    waiter = asyncio.ensure_future(waiting)
    stopper = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopper.cancel()


class LaneQueue:
    """A lane's items waiting for a worker, handed out by rank, then escalated items in the
    order they were escalated and the others by order key; bounded, so that the feeder claims
    only what the workers are about to take."""

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, float, int, int, PendingItem | None]] = (
            asyncio.PriorityQueue(maxsize)
        )
        self._seq = itertools.count()

    async def put(self, item: PendingItem, rank: int) -> None:
        await self._queue.put((rank, item.escalated_at, item.order_key, next(self._seq), item))

    async def close(self, workers: int) -> None:
        """One end marker per worker, taken after every item."""
        for _ in range(workers):
            await self._queue.put((LAST_RANK, 0.0, 0, next(self._seq), None))

    async def get(self) -> PendingItem | None:
        return (await self._queue.get())[4]


@dataclass
class Gate:
    """A dataset's hand-out in one lane while its budget's room is taken by requests in flight."""

    saturated: bool = False
    """An item was refused for want of room, and none admitted since."""
    probing: bool = False
    """Saturated, and one item is out to try the room: no other goes until it is decided."""
    change: asyncio.Future[None] | None = None
    """Resolves when the dataset's budget changes (a request settles, the budget is met)."""
    deferred: list[tuple[int, int, PendingItem]] = field(default_factory=list)
    """Items set aside, as a heap by order key: they go first when room is found."""
    undecided: int = 0
    """Items handed out that a worker has not yet admitted or set aside."""

    @property
    def open(self) -> bool:
        return not self.saturated or (
            self.change is not None and self.change.done() and not self.probing
        )


@dataclass
class _LaneFeed:
    """Where the feeder stands in one lane's datasets: their ranks and gates, the items
    claimed and not yet handed out, how far each was claimed, and which are done."""

    lane: str
    names: list[str]
    rank: dict[str, int]
    gates: dict[str, Gate]
    claimed: dict[str, deque[PendingItem]]
    after: dict[str, int]
    """The key each dataset was claimed up to (order key, or pilot key in a pilot; -1:
    nothing claimed yet)."""
    exhausted: set[str] = field(default_factory=set)
    """Datasets the store has no more pending items of."""
    finished: set[str] = field(default_factory=set)


LED_MEMORY = 10_000
"""Conversations a lane remembers having led in this run: its items are contiguous in the
dispatch order, so a conversation's items come in a row (an item of one forgotten only
waits for a leader of its own)."""


@dataclass
class _Followers:
    """A lane's conversations whose first item handed out in this run (their leader) has not
    ended its first attempt, and their later items set aside meanwhile: a provider caches a
    prompt only once its request is computed, so each later turn would pay the history again.
    Once `bound` items (the lane's concurrency) wait, the lane opens no new conversation until
    a leader ends (`full`): those items fill it then, and each new conversation opened
    meanwhile would only wait longer for the lane, past the provider's cache lifetime (on
    bench/cache_cost.py at a 20 s lifetime, filling the lane with new leaders instead paid
    1.07-1.11x the floor). Memory holds at most `bound` items and a claimed batch."""

    bound: int
    samples_together: bool = False
    """The lane's servers answer a prompt's samples from one prefill (`n`, client/batch.py):
    the leader's samples go with it rather than wait."""
    leading: dict[str, PendingItem] = field(default_factory=dict)
    """Each conversation's leader in flight, by conversation id."""
    aside: OrderedDict[str, list[PendingItem]] = field(default_factory=OrderedDict)
    """Items waiting for their conversation's leader, by conversation, oldest leader first."""
    waiting: Counter[str] = field(default_factory=Counter)
    """Items set aside, per dataset."""
    ready: dict[str, list[tuple[int, int, PendingItem]]] = field(default_factory=dict)
    """Items let go, per dataset, as heaps by order key: they go before new claims."""
    led: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """Conversations led in this run, the most recent last (LED_MEMORY of them)."""

    def set_aside(self, item: PendingItem, seq: int) -> bool:
        """Whether `item` waits for its conversation's leader (else it goes now, and leads
        its conversation if none did in this run). A prompt's samples are one conversation:
        the later ones wait too, unless the lane sends them as one request."""
        cid = item.conversation_id
        leader = self.leading.get(cid)
        if leader is None:
            if cid not in self.led:
                self.leading[cid] = item
                self.led[cid] = None
                if len(self.led) > LED_MEMORY:
                    self.led.popitem(last=False)
            return False
        if self.samples_together and leader.turn_index == item.turn_index:
            return False
        self.aside.setdefault(cid, []).append(item)
        self.waiting[item.dataset] += 1
        return True

    @property
    def full(self) -> bool:
        """Enough items wait behind leaders in flight to fill the lane when they end: open no
        new conversation meanwhile."""
        return sum(self.waiting.values()) >= self.bound

    def let_go(self, cid: str, seq: int) -> bool:
        """The conversation's set-aside items go (before new claims); whether there were any."""
        items = self.aside.pop(cid, [])
        for item in items:
            self.waiting[item.dataset] -= 1
            heapq.heappush(self.ready.setdefault(item.dataset, []), (item.order_key, seq, item))
        return bool(items)

    def ended(self, item: PendingItem, seq: int) -> bool:
        """A leader's first attempt ended (answered, failed, escalated, refused, abandoned):
        its conversation's items go. Whether any were waiting."""
        cid = item.conversation_id
        leader = self.leading.get(cid)
        if leader is None or leader.id != item.id:
            return False
        del self.leading[cid]
        return self.let_go(cid, seq)

    def drop(self, dataset: str) -> None:
        """The dataset is held back: its waiting items stay pending in the store."""
        for cid in [c for c, items in self.aside.items() if items[0].dataset == dataset]:
            del self.aside[cid]
        self.waiting[dataset] = 0
        self.ready.pop(dataset, None)


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
        pilot: Mapping[str, int] | None = None,
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
        self._gates: dict[tuple[str, str], Gate] = {}
        self._wake = {name: asyncio.Event() for name in lanes}
        """Set when a lane's feeder may have something new to hand out."""
        self._seq = itertools.count()
        self._followers = {
            name: _Followers(
                bound=lane.concurrency,
                samples_together=any(isinstance(e.sender, SampleBatcher) for e in lane.endpoints),
            )
            for name, lane in lanes.items()
        }

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def deferrable(self, item: PendingItem) -> bool:
        """Whether a worker refused for want of the dataset's room may set the item aside.
        Not an escalated item (its lane's feeder does not claim its dataset) nor a turn of a
        sequential dataset (the next turn waits on it)."""
        return item.dataset not in self._sequential and item.id not in self._escalated_sent

    def defer(self, lane: str, item: PendingItem) -> None:
        """A worker's item is refused while its dataset's room is held by requests in flight:
        it waits here, and the dataset's next items wait for the budget to change. Called
        in the same step as the refusal, so no settlement between them goes unheard."""
        gate = self._gates[lane, item.dataset]
        gate.undecided -= 1
        gate.saturated, gate.probing = True, False
        heapq.heappush(gate.deferred, (item.order_key, next(self._seq), item))
        self._fed[item.dataset] -= 1
        if self._budget is not None and (gate.change is None or gate.change.done()):
            gate.change = self._budget.changed(item.dataset, lane)
            gate.change.add_done_callback(lambda _: self._wake[lane].set())
        self._wake[lane].set()

    def decided(self, lane: str, item: PendingItem) -> None:
        """A worker's item handed out by the feeder was admitted (or ended without being sent):
        a probe that passed lets the dataset's next item go."""
        gate = self._gates.get((lane, item.dataset))
        if gate is None or item.id in self._escalated_sent:
            return
        gate.undecided -= 1
        gate.probing = False
        self._wake[lane].set()

    def attempt_ended(self, lane: str, item: PendingItem) -> None:
        """A worker's attempt at an item ended, however: if the item leads its conversation,
        the conversation's items set aside go (a provider's cache now holds its prompt)."""
        followers = self._followers.get(lane)
        if followers is not None and followers.ended(item, next(self._seq)):
            self._wake[lane].set()

    async def feed(self, lane: LaneRuntime, queue: LaneQueue) -> None:
        """Fill the lane's queue with its pending items, then an end marker per worker."""
        batch_size = max(64, min(2 * lane.concurrency, 4096))
        # Items escalated to this lane go out as they come, beside the lane's own datasets: a
        # sequential turn of this lane may wait for one of them.
        escalated = asyncio.create_task(self._feed_escalated(lane, queue, batch_size))
        try:
            await self._feed_datasets(lane, queue, batch_size)
            await escalated
        finally:
            escalated.cancel()
        await queue.close(lane.concurrency)

    async def _feed_datasets(self, lane: LaneRuntime, queue: LaneQueue, batch_size: int) -> None:
        """Hand out the lane's datasets in order: each dataset's items until it is sent or held
        back, going on to the next while its room is held by requests in flight."""
        names = list(lane.datasets)
        feed = _LaneFeed(
            lane=lane.name,
            names=names,
            rank={name: i + 1 for i, name in enumerate(names)},
            gates={name: self._gates.setdefault((lane.name, name), Gate()) for name in names},
            claimed={name: deque() for name in names},
            after=dict.fromkeys(names, -1),
        )
        wake = self._wake[lane.name]
        while not self.stopping:
            wake.clear()
            ready, live = self._ready_dataset(feed)
            if ready is None:
                if not live:
                    return
                await until_set(wake.wait(), self._stopping)
                continue
            if ready in self._sequential:
                await self._feed_sequential(lane, queue, ready, feed.rank[ready], batch_size)
                feed.finished.add(ready)
                continue
            gate = feed.gates[ready]
            item = self._next_item(feed, lane.name, ready, batch_size)
            if item is None:
                continue
            gate.probing = gate.saturated
            gate.undecided += 1
            await self._put(queue, item, feed.rank[ready])

    def _ready_dataset(self, feed: _LaneFeed) -> tuple[str | None, bool]:
        """The first dataset of the lane with items to hand out and its gate open (None if
        none), and whether any is still live (items left, or some handed out undecided).
        Datasets found sent or held back are marked finished on the way."""
        live = False
        followers = self._followers[feed.lane]
        for name in feed.names:
            if name in feed.finished:
                continue
            gate = feed.gates[name]
            if self._held_back(name):
                # Its set-aside items stay pending; those handed out are refused in turn.
                feed.finished.add(name)
                gate.deferred.clear()
                followers.drop(name)
                continue
            unclaimed = bool(feed.claimed[name]) or name not in feed.exhausted
            # No new claim while the lane is full of items waiting for their leaders.
            has_items = bool(gate.deferred or followers.ready.get(name)) or (
                unclaimed and not followers.full
            )
            # Items waiting for their leaders, or for the lane, keep the dataset live.
            if not (has_items or unclaimed or gate.undecided or followers.waiting[name]):
                feed.finished.add(name)
                continue
            live = True
            if has_items and gate.open:
                return name, live
        return None, live

    def _next_item(
        self, feed: _LaneFeed, lane: str, name: str, batch_size: int
    ) -> PendingItem | None:
        """The dataset's next item: a set-aside one first, then one its conversation's leader
        let go, else the next claimed from the store (a batch at a time) that need not wait
        for its leader; None once the store has no more (it is marked exhausted)."""
        gate = feed.gates[name]
        if gate.deferred:
            return heapq.heappop(gate.deferred)[2]
        ready = self._followers[lane].ready.get(name)
        if ready:
            return heapq.heappop(ready)[2]
        followers = self._followers[lane]
        while not followers.full:
            item = self._claimed_item(feed, lane, name, batch_size)
            # A pilot's items are spread over conversations: none waits.
            if item is None or self._pilot is not None:
                return item
            if not followers.set_aside(item, next(self._seq)):
                return item
        return None

    def _claimed_item(
        self, feed: _LaneFeed, lane: str, name: str, batch_size: int
    ) -> PendingItem | None:
        """The dataset's next item claimed from the store (a batch at a time); None once the
        store has no more (it is marked exhausted)."""
        if not feed.claimed[name]:
            if feed.after[name] == -1:
                failpoints.reached("dataset", name)
            # A pilot takes each dataset's items in its shuffle, not in dispatch order (which
            # keeps a conversation's items together): its sample is spread over conversations.
            pilot = self._pilot is not None
            batch = self._store.work.claim_batch(
                name, feed.after[name], batch_size, lane=lane, pilot=pilot
            )
            if not batch:
                feed.exhausted.add(name)
                return None
            feed.claimed[name].extend(batch)
            feed.after[name] = batch[-1].pilot_key if pilot else batch[-1].order_key
        return feed.claimed[name].popleft()

    async def _feed_sequential(
        self, lane: LaneRuntime, queue: LaneQueue, name: str, rank: int, batch_size: int
    ) -> None:
        """A sequential dataset: its ready turns, then each turn as its previous one is
        answered, until none waits."""
        failpoints.reached("dataset", name)
        after = -1
        while not self.stopping and not self._held_back(name):
            batch = self._store.work.claim_batch(name, after, batch_size, lane=lane.name)
            if not batch:
                break
            for item in batch:
                if self.stopping or self._held_back(name):
                    break
                await self._put(queue, item, rank)
            after = batch[-1].order_key
        await self._feed_waiting(lane, queue, name, rank, batch_size)

    async def _feed_escalated(self, lane: LaneRuntime, queue: LaneQueue, batch_size: int) -> None:
        """Items escalated to this lane arrive while the lanes that send them still run.
        Pass over them in pages, in the order they were escalated (those already handed out
        are skipped, and on a wide lane they fill whole pages), until a pass that began after
        those lanes finished finds nothing new. An item escalated during a pass comes after
        every item before it, so the lane serves its backlog first escalated, first out, across
        restarts too; the plan and the ETA play it so (`run.ending`, `eta.fed_spending`)."""
        sources = [s for s in self._lanes.values() if s.escalate_to == lane.name]
        cursor: tuple[float, int, str] | None = None
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
                    await queue.put(item, ESCALATED_RANK)
            if len(page) == batch_size:
                cursor = (page[-1].escalated_at, page[-1].order_key, page[-1].id)
                continue
            cursor = None
            if not fed:
                if sources_done:
                    return
                await asyncio.sleep(0.2)

    async def _put(self, queue: LaneQueue, item: PendingItem, rank: int) -> None:
        self._fed[item.dataset] += 1
        if item.dataset in self._sequential:
            self._commits.handed_out(item)
        await queue.put(item, rank)

    async def _feed_waiting(
        self,
        lane: LaneRuntime,
        queue: LaneQueue,
        name: str,
        rank: int,
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
                    await self._put(queue, item, rank)
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
            if self._fed[dataset] >= self._pilot.get(dataset, 0) - done:
                return True
        return self._budget is not None and self._budget.datasets[dataset].met is not None
