"""Admission: how many requests may be in flight to one endpoint, adapted to what it answers.

AIMD with a slow start: the limit starts at `initial`, grows by `slow_start_step` per success
(one: it doubles every round trip) until the first overload (429 or 503/529), then by
`probe`/limit per success (about `probe` slots per round trip). An overload decreases it at
most once per round trip, and by the share of refusals among the requests sent since the last
decrease (its epoch): sending L to an endpoint that takes C < L gets about (L - C) / L of them
refused, so L * (1 - share) is about C. Answers to requests of an earlier epoch neither count
nor decrease again: the reaction to their burst has happened. (Counting answers instead of
requests would be biased: a 429 comes back at once, a success only after a round trip.) The
factor stays between `min_decrease` (a storm halves the limit at most) and `decrease` (a lone
429 after a good stretch costs 5%). The limit stays between 1 and the lane's concurrency.

A 503 or 529 (`strained`) says overloaded too, but providers also send them now and then when
nothing is saturated: it counts among the refusals, and decreases only once the refusals are
at least `noise_floor` (1%) of the epoch's requests. Otherwise a steady trickle of them holds
the limit far below what the endpoint takes (half of it, in bench/compare.py, before this).
Against a fixed capacity it saws between 95% and 100% of it (bench/engine.py capacity).

Waiters are handed their slot directly when one frees up, so the limit is never exceeded, and
a waiter that is cancelled after being handed a slot gives it back. A retry waits at the front:
behind a full lane's waiting workers (512 workers on a limit of 400) it went out only after a
hundred new requests, and a run's last rows were its retries, sent late.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable


class AdaptiveLimit:
    """A concurrency limit that adapts to overload signals."""

    def __init__(
        self,
        max_limit: int,
        initial: int,
        *,
        adaptive: bool = True,
        decrease: float = 0.95,
        min_decrease: float = 0.5,
        probe: float = 4.0,
        slow_start_step: float = 1.0,
        noise_floor: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_limit = max_limit
        self.adaptive = adaptive
        self.limit = float(min(initial, max_limit) if adaptive else max_limit)
        self.in_flight = 0
        self.overloads = 0
        self._decrease = decrease
        self._min_decrease = min_decrease
        self._probe = probe
        self._slow_start_step = slow_start_step
        self._noise_floor = noise_floor
        self.epoch = 0
        """Counts the decreases: each slot is handed out with the epoch it belongs to."""
        self._sent = 0
        self._refused = 0
        """Requests sent in this epoch, and those refused (429, overload) so far."""
        self._clock = clock
        self._slow_start = adaptive
        self._last_decrease = float("-inf")
        self._rtt_s: float | None = None
        self._paused_until = 0.0
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def current(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self, *, first: bool = False) -> int:
        """Wait for a slot; returns its epoch, to pass to `release`, which the caller must
        call exactly once afterwards. `first`: ahead of the waiters there are (a retry)."""
        pause = self._paused_until - self._clock()
        if pause > 0:
            await asyncio.sleep(pause)
        if self.in_flight < self.current and not self._waiters:
            self.in_flight += 1
            self._sent += 1
            return self.epoch
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if first:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._free_slot()  # we were handed a slot we will not use
            else:
                self._waiters.remove(fut)
            raise

    def release(
        self,
        outcome: str,
        *,
        epoch: int | None = None,
        latency_s: float | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        """Give the slot back, saying how it went: `ok`, `overload` (429), `strained` (503,
        529), `paused` or `other`, with the epoch `acquire` gave (None: the current one)."""
        current = epoch is None or epoch == self.epoch
        if outcome == "ok" and self.adaptive:
            if latency_s is not None:
                rtt = self._rtt_s
                self._rtt_s = latency_s if rtt is None else 0.8 * rtt + 0.2 * latency_s
            step = self._slow_start_step if self._slow_start else self._probe / max(self.limit, 1.0)
            self.limit = min(float(self.max_limit), self.limit + step)
        elif outcome in ("overload", "strained", "paused"):
            self.overloads += 1
            now = self._clock()
            # One decrease per round trip; 0.1 s until a round trip has been seen.
            cooldown = 0.1 if self._rtt_s is None else self._rtt_s
            if current:
                self._refused += 1
            share = self._refused / max(self._sent, self._refused, 1)
            noise = outcome == "strained" and share < self._noise_floor
            if self.adaptive and current and not noise and now - self._last_decrease >= cooldown:
                factor = min(self._decrease, max(self._min_decrease, 1.0 - share))
                self.limit = max(1.0, self.limit * factor)
                self._slow_start = False
                self._last_decrease = now
                self.epoch += 1
                self._sent = self._refused = 0
            if outcome == "paused" and retry_after_s:
                self._paused_until = max(self._paused_until, now + retry_after_s)
        self._free_slot()

    def _free_slot(self) -> None:
        self.in_flight -= 1
        while self._waiters and self.in_flight < self.current:
            fut = self._waiters.popleft()
            if not fut.done():
                self.in_flight += 1
                self._sent += 1
                fut.set_result(self.epoch)


class EndpointHealth:
    """Cools an endpoint down after consecutive failures that say it is unwell."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.consecutive_failures = 0
        self.cool_until = 0.0

    @property
    def healthy(self) -> bool:
        return self._clock() >= self.cool_until

    @property
    def drained(self) -> bool:
        """Out of rotation until a health probe says the server is back."""
        return self.cool_until == math.inf

    def drain(self) -> None:
        """Take the endpoint out of rotation at once (its server refused a connection or is
        loading); `revive` puts it back."""
        self.cool_until = math.inf

    def revive(self) -> None:
        self.consecutive_failures = 0
        self.cool_until = 0.0

    def record(self, ok: bool) -> None:
        if ok:
            self.consecutive_failures = 0
            return
        self.consecutive_failures += 1
        # The requests in flight to a server that went down fail one after another: they must
        # not end its drain (a cool-down instead put it back within seconds and the next
        # failure drained it again, counted as another outage).
        if self.consecutive_failures >= 3 and not self.drained:
            # 5 s after the third failure in a row, doubling, at most a minute.
            cool = min(60.0, 5.0 * 2 ** (self.consecutive_failures - 3))
            self.cool_until = self._clock() + cool
