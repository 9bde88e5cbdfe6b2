"""The servers of a run's lanes: which one takes an attempt, which are drained (a self-hosted
server that refused or dropped a connection, or is loading), and when a lane whose servers are
all down may go on."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from regen.config import RunConfig
from regen.engine.feeder import until_set
from regen.engine.runtime import EndpointRuntime, LaneRuntime, Outage
from regen.errors import EndpointError

if TYPE_CHECKING:
    from regen.engine.stats import RunStats

PROBE_EVERY_S = (0.5, 2.0)
"""A drained server's health is probed this often, doubling up to the second figure."""

AFFINITY_SLACK = (4.0, 16)
"""A conversation's next turn stays on the server of its last turn while that server's load
(outstanding attempts for its weight) is at most 4x + 16 of the least loaded server's: a long
conversation keeps its prefix cache but never piles work on one server while others idle.
Measured (bench/cache_cost.py, 24 trajectories on 4 vLLM sims, 32 at once): at 2x + 4
conversations moved so often that the pool computed 2.3x the distinct prefixes, at 3x + 8
1.7x, at 4x + 16 1.1x, with no longer wall time than without affinity. A conversation's own
attempts in flight do not count against its server: the turns a leader's answer lets go
(`[run] cache_order`) go out together, and counting them moved the last of them to another
server that computed the history again (+36% over the floor, seed 1; +3% on seeds 1-3 when
not counted, wall time no longer than with affinity off)."""

AFFINITY_CONVERSATIONS = 100_000
"""Conversations whose last server is remembered (in memory only, least recently used first
out): more than are in flight at once, so an evicted one has long left every prefix cache."""


class ServerPool:
    """Picks a lane's server for each attempt, drains the ones that are down and probes them
    until they are back; a lane with every server down waits for one, for a bounded time."""

    def __init__(
        self,
        stats: RunStats,
        run: RunConfig,
        rng: random.Random,
        *,
        sleep: Callable[[float], Awaitable[None]],
        stopping: asyncio.Event,
        stop: Callable[..., None],
    ) -> None:
        self._stats = stats
        self._run = run
        self._rng = rng
        self._sleep = sleep
        self._stopping = stopping
        self._stop = stop
        self.probes: set[asyncio.Task[None]] = set()
        """Health probes running (cancelled with the run's other tasks)."""
        self._down_since: dict[str, float] = {}
        """When every server of a lane was drained (its items wait for one to come back)."""
        self._revived = asyncio.Event()
        """Set when a drained server comes back (then replaced for the next wait)."""
        self._last: OrderedDict[tuple[str, str], EndpointRuntime] = OrderedDict()
        """(lane, conversation id) -> the self-hosted server that took its last attempt."""

    def pick(self, lane: LaneRuntime, conversation: str | None = None) -> EndpointRuntime:
        """The healthy endpoint with the fewest attempts outstanding for its weight (ties:
        at random); when none is healthy, the one that cools down first. A `conversation`'s
        turns and samples stay on the self-hosted server of its last attempt, where its prefix
        is cached, while that server is healthy and within AFFINITY_SLACK of the least loaded
        ([run] prefix_affinity)."""
        eps = lane.endpoints
        if len(eps) == 1:
            return eps[0]
        healthy = [e for e in eps if e.health.healthy]
        if not healthy:
            return min(eps, key=lambda e: (e.health.cool_until, self._rng.random()))
        best = min(healthy, key=lambda e: (_load(e), self._rng.random()))
        if conversation is None or not self._run.prefix_affinity or best.health_url is None:
            return best  # hosted APIs route by session_id at the provider
        key = (lane.name, conversation)
        last = self._last.get(key)
        factor, extra = AFFINITY_SLACK
        own = last.own.get(conversation, 0) / last.weight if last is not None else 0.0
        if (
            last is not None
            and last.health.healthy
            and _load(last) - own <= factor * _load(best) + extra
        ):
            best = last
        self._last[key] = best
        self._last.move_to_end(key)
        if len(self._last) > AFFINITY_CONVERSATIONS:
            self._last.popitem(last=False)
        return best

    def drain(self, ep: EndpointRuntime, exc: EndpointError) -> bool:
        """A self-hosted server that refused or dropped a connection, or is loading (503),
        leaves the pool until its health probe passes. True when the attempt is a failover:
        the server was drained, and the item goes to another healthy endpoint of the lane at
        once, or waits for one to come back (`back`), without using up an attempt."""
        if ep.health_url is None:
            return False
        if exc.failure_class != "connection" and exc.status != 503:
            return False
        outages = self._stats.endpoints[ep.name].outages
        if not ep.health.drained:
            ep.health.drain()
            outages.append(Outage(time.time()))
            if ep.probing is None or ep.probing.done():
                ep.probing = asyncio.create_task(self._probe(ep))
                self.probes.add(ep.probing)
                ep.probing.add_done_callback(self.probes.discard)
        outages[-1].resent += 1
        return True

    async def back(self, lane: LaneRuntime) -> bool:
        """When every server of the lane is drained, wait for a health probe to bring one
        back, for at most [run].pool_down_timeout_s from when the last one went down; then
        stop the run (its items stay pending). False: the run stops."""
        if not all(e.health.drained for e in lane.endpoints):
            return not self._stopping.is_set()
        since = self._down_since.setdefault(lane.name, time.monotonic())
        bound = self._run.pool_down_timeout_s
        while all(e.health.drained for e in lane.endpoints) and not self._stopping.is_set():
            left = since + bound - time.monotonic()
            if left <= 0:
                names = ", ".join(e.name for e in lane.endpoints)
                self._stop(
                    f"every server of lane {lane.name} ({names}) has been down for {bound:g} s "
                    "(connections refused, or loading: /health never answered 200); start them "
                    "(or raise [run].pool_down_timeout_s) and run again to send what is left",
                    outage=True,
                )
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._until_stop(self._revived.wait()), left)
        return not self._stopping.is_set()

    async def _probe(self, ep: EndpointRuntime) -> None:
        """Probe a drained server's /health until it answers 200, then put it back."""
        assert ep.health_url is not None
        wait, most = PROBE_EVERY_S
        while not self._stopping.is_set():
            await self._until_stop(self._sleep(wait))
            if self._stopping.is_set():
                return
            if await ep.sender.probe(ep.health_url):
                ep.health.revive()
                self._stats.endpoints[ep.name].outages[-1].end = time.time()
                self._down_since.clear()
                revived, self._revived = self._revived, asyncio.Event()
                revived.set()
                return
            wait = min(most, wait * 2)

    async def _until_stop(self, waiting: Awaitable[Any]) -> None:
        await until_set(waiting, self._stopping)


def _load(ep: EndpointRuntime) -> float:
    """An endpoint's load were it to take one more attempt: outstanding for its weight."""
    return (ep.outstanding + 1) / ep.weight
