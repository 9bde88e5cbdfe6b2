from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.engine.limiter import AdaptiveLimit, EndpointHealth


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slot(lim: AdaptiveLimit) -> int:
    """Take a free slot through `acquire` (it completes at once when one is free)."""
    coro = lim.acquire()
    try:
        coro.send(None)
    except StopIteration as done:
        return int(done.value)
    coro.close()
    raise AssertionError("no free slot")


def answer(lim: AdaptiveLimit, outcome: str, n: int = 1, latency_s: float = 0.5) -> None:
    """Send n requests and get `outcome` for each."""
    for _ in range(n):
        epoch = slot(lim)
        lim.release(outcome, epoch=epoch, latency_s=latency_s)


def test_slow_start_then_one_decrease_per_round_trip() -> None:
    clock = Clock()
    lim = AdaptiveLimit(100, 10, clock=clock)
    answer(lim, "ok", 10)
    assert lim.current == 20  # +1 per success before the first overload
    answer(lim, "overload", 5)  # a burst of 429s at one moment counts once
    assert lim.current == int(20 * (1 - 1 / 11))  # one refusal among eleven requests sent
    clock.now += 1.0  # a round trip later, another overload counts again
    answer(lim, "overload")
    # Since the last decrease, five requests were sent and all were refused: halve at most.
    assert lim.current == int(20 * (1 - 1 / 11) * 0.5)
    before = lim.limit
    answer(lim, "ok", round(before))
    assert 3.0 < lim.limit - before < 5.0  # additive: about four per window of successes


def test_a_decrease_follows_the_share_of_requests_refused_since_the_last() -> None:
    clock = Clock()
    lim = AdaptiveLimit(1000, 800, clock=clock)
    lim._slow_start = False
    lim._last_decrease = clock.now  # as if it had just decreased: an epoch starts
    # Sending 800 where 600 fit: a quarter are refused, so the limit goes to about 600.
    for i in range(800):
        answer(lim, "overload" if i % 4 == 0 else "ok", latency_s=1.0)
    clock.now += 5.0
    answer(lim, "overload")
    assert 560 < lim.current < 620
    # A lone 429 after a long good stretch costs the gentlest step.
    for _ in range(10):
        answer(lim, "ok", 500, latency_s=1.0)
    clock.now += 5.0
    before = lim.limit
    answer(lim, "overload")
    assert lim.limit == before * 0.95


def test_refusals_of_requests_sent_before_a_decrease_do_not_decrease_again() -> None:
    clock = Clock()
    lim = AdaptiveLimit(1000, 500, clock=clock)
    old = [slot(lim) for _ in range(300)]  # sent before the overload
    answer(lim, "overload")
    after = lim.limit
    clock.now += 10.0  # long past the cool-down
    for epoch in old:  # the rest of that burst comes back refused
        lim.release("overload", epoch=epoch)
    assert lim.limit == after and lim.overloads == 301


def test_non_adaptive_limit_is_the_concurrency() -> None:
    lim = AdaptiveLimit(300, 10, adaptive=False)
    answer(lim, "overload")
    assert lim.current == 300


def test_limit_stays_between_one_and_the_maximum() -> None:
    clock = Clock()
    lim = AdaptiveLimit(8, 4, clock=clock)
    for _ in range(100):
        clock.now += 10
        answer(lim, "overload")
    assert lim.current == 1
    answer(lim, "ok", 1000, latency_s=0.01)
    assert lim.current == 8


@settings(max_examples=60, deadline=None)
@given(
    max_limit=st.integers(1, 20),
    initial=st.integers(1, 20),
    signals=st.lists(st.sampled_from(["ok", "overload", "other"]), min_size=1, max_size=60),
    cancel_every=st.integers(2, 9),
)
def test_in_flight_never_exceeds_the_limit(
    max_limit: int, initial: int, signals: list[str], cancel_every: int
) -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(max_limit, initial)
        peak = 0

        async def user(i: int, signal: str) -> None:
            nonlocal peak
            epoch = await lim.acquire()
            try:
                peak = max(peak, lim.in_flight)
                await asyncio.sleep(0)
            finally:
                lim.release(signal, epoch=epoch, latency_s=0.01)

        tasks = [asyncio.create_task(user(i, s)) for i, s in enumerate(signals)]
        await asyncio.sleep(0)
        for t in tasks[::cancel_every]:
            t.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=10)
        assert lim.in_flight == 0  # every slot came back, cancelled waiters included
        assert peak <= max_limit

    asyncio.run(scenario())


def test_health_cools_down_after_three_failures_in_a_row() -> None:
    clock = Clock()
    h = EndpointHealth(clock)
    h.record(False)
    h.record(False)
    h.record(True)
    h.record(False)
    h.record(False)
    assert h.healthy
    h.record(False)
    assert not h.healthy
    clock.now += 5.0
    assert h.healthy


def test_a_trickle_of_503s_does_not_hold_the_limit_down() -> None:
    clock = Clock()
    lim = AdaptiveLimit(1000, 100, clock=clock)
    answer(lim, "ok", 400)
    start = lim.limit
    # One 503 in every 300 answers (0.3%), spread over many round trips: no decrease.
    for _ in range(20):
        answer(lim, "ok", 299)
        clock.now += 1.0
        answer(lim, "strained")
    assert lim.limit >= start and lim.epoch == 0
    # A burst of them (over 1% of the requests since the last decrease) decreases.
    clock.now += 1.0
    answer(lim, "strained", 80)
    assert lim.epoch == 1 and lim.limit < 1000
    # A 429 decreases at once.
    clock.now += 1.0
    before = lim.limit
    answer(lim, "overload")
    assert lim.epoch == 2 and lim.limit < before


def test_failures_after_a_drain_do_not_put_the_endpoint_back() -> None:
    """The requests in flight to a server that went down fail one after another. A cool-down
    set by the third of them ended the drain within seconds, and the next failure drained it
    again: one outage was counted 73 times."""
    clock = [0.0]
    health = EndpointHealth(clock=lambda: clock[0])
    health.drain()
    for _ in range(10):
        health.record(False)
    clock[0] += 3600.0
    assert health.drained and not health.healthy
    health.revive()
    assert health.healthy and not health.drained


async def test_a_retry_waits_ahead_of_the_items_not_tried_yet() -> None:
    """A full lane has more workers than slots: a retry queued behind them went out after a
    hundred new requests, and the run's last rows were its retries."""
    limit = AdaptiveLimit(1, 1, adaptive=False)
    first = await limit.acquire()
    new = asyncio.ensure_future(limit.acquire())
    await asyncio.sleep(0)
    retry = asyncio.ensure_future(limit.acquire(first=True))
    await asyncio.sleep(0)
    limit.release("ok", epoch=first)
    await asyncio.sleep(0)
    assert retry.done() and not new.done()
    limit.release("ok", epoch=retry.result())
    assert await new == limit.epoch
