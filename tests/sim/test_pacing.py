"""The simulator's answers on their own clock (sim/respond.py `Paced`): each piece goes out a
simulated time after the request came, whatever the simulator spent of its own CPU meanwhile.
Played on a fake clock: `asyncio.sleep` in the module advances it, so nothing here depends on
the machine's speed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from regen.sim import SimConfig, respond
from regen.sim.respond import Paced
from regen.sim.server import LoggedRequest, Simulator
from tests.sim.helpers import turns
from tests.sim.test_selfhosted_cache import chat, config, served, stats


class Clock:
    """The loop's time, moved only by the waits `Paced` asks for (and by `spend`). Times are
    binary fractions, so that sums are exact."""

    def __init__(self) -> None:
        self.now = 1024.0
        self.waits: list[float] = []
        self.writes: list[tuple[float, bytes]] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def spend(self, seconds: float) -> None:
        """The simulator busy elsewhere (rendering a prompt, other answers' chunks)."""
        self.now += seconds


class Resp:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def write(self, data: bytes) -> None:
        self.clock.writes.append((self.clock.now, data))


def paced(monkeypatch: pytest.MonkeyPatch, since_ago: float, scale: float = 1.0) -> Any:
    clock = Clock()
    monkeypatch.setattr(respond.asyncio, "sleep", clock.sleep)
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "time", lambda: clock.now)
    entry = LoggedRequest(0.0, "/v1/chat/completions", 200, None, since=clock.now - since_ago)
    return clock, Paced(Resp(clock), scale, entry)  # type: ignore[arg-type]


PIECE_S = 1 / 256
"""A piece's simulated time (4 ms)."""


async def answer(out: Paced, pieces: int, each_s: float = PIECE_S) -> None:
    for k in range(pieces):
        out.raw(b"%d;" % k)
        await out.pace(each_s)
    await out.finish()


def sent(clock: Clock) -> bytes:
    return b"".join(d for _, d in clock.writes)


async def test_an_answer_on_time_takes_its_simulated_time_in_writes_10_ms_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, out = paced(monkeypatch, since_ago=0.0, scale=0.5)
    start = clock.now
    await answer(out, 96)  # 0.375 s simulated, half of it at half scale
    assert clock.now - start == 0.1875
    times = [t - start for t, _ in clock.writes]
    # Pieces 2 ms apart go out several at a time: each write 10-20 ms after the one before.
    assert all(0.01 <= b - a < 0.02 for a, b in zip(times, times[1:], strict=False))
    assert sent(clock) == b"".join(b"%d;" % k for k in range(96))


async def test_time_the_simulator_spent_before_the_answer_is_not_added_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The request came 0.25 s ago (its prompt waited behind others' on the simulator's one
    # core): a first token due 0.5 s after it comes 0.25 s from now, and the answer ends
    # when it was due, not 0.25 s later.
    clock, out = paced(monkeypatch, since_ago=0.25)
    start = clock.now
    await out.pace(0.5)
    assert clock.now - start == 0.25
    await answer(out, 64)
    assert clock.now - start == 0.5
    assert out._entry.late_s == 0.0


async def test_an_answer_the_simulators_work_outran_says_how_late_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its work took longer than the whole answer's time: it ends late, and says by how much
    # (`/_sim/stats` "late"), so that a bench knows its times are partly the simulator's.
    clock, out = paced(monkeypatch, since_ago=0.0)
    start = clock.now
    await out.pace(0.25)
    clock.spend(1.0)
    await answer(out, 64)  # due 0.5 s after it came; the simulator was busy until 1.25 s
    assert clock.now - start == 1.25
    assert out._entry.late_s == 0.75


async def test_an_answer_held_up_midway_catches_up_and_ends_when_it_was_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, out = paced(monkeypatch, since_ago=0.0)
    start = clock.now
    for k in range(256):
        out.raw(b"%d;" % k)
        await out.pace(PIECE_S)
        if k == 63:
            clock.spend(0.5)  # the loop busy for half a second, a quarter in
    await out.finish()
    assert clock.now - start == 1.0  # when it was due, not 1.5 s
    # What came due while it was held (0.5 s of pieces, written 3 at a time) went out as it
    # was made, when the loop was back, with no wait in between.
    back = next(t for t, _ in clock.writes if t - start > 0.5)
    assert sum(t == back for t, _ in clock.writes) >= 40
    assert sent(clock) == b"".join(b"%d;" % k for k in range(256))


async def test_a_stall_waits_its_whole_length_even_when_late_and_delays_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, out = paced(monkeypatch, since_ago=0.25)
    start = clock.now
    await answer(out, 32)  # 0.125 s, all due in the past: no wait
    assert clock.now == start
    await out.stall(2.0)
    assert clock.now - start == 2.0  # the whole stall, not 2.0 less how late it was
    await answer(out, 32)
    assert clock.now - start == 2.125


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_every_whole_answer_is_timed_and_counted_in_the_stats(dialect: str) -> None:
    # Streamed or not, each whole answer says how late it was; `/_sim/stats` counts them.
    async with served(config(dialect, time_scale=0.01)) as sim:
        await chat(sim, turns(1, 1))
        await chat(sim, turns(1, 2), stream=True, stream_options={"include_usage": True})
        late = (await stats(sim))["late"]
        assert late["answers"] == 2
        assert all(e.late_s is not None and e.late_s >= 0 for e in sim.simulator.chat_log())
        assert late["worst_s"] == max(e.late_s or 0 for e in sim.simulator.chat_log())


async def test_requests_are_worked_on_one_per_pass_of_the_loop() -> None:
    # Between two requests' work (rendering, tokenizing, making the answer) the loop takes a
    # pass, reading what has arrived: a request that comes during a burst notes its arrival
    # then, not once the whole burst is worked on.
    sim = Simulator(SimConfig())
    loop = asyncio.get_running_loop()
    order: list[str] = []

    async def request(k: int) -> None:
        await sim._turn()
        order.append(f"work {k}")
        loop.call_soon(order.append, f"pass after {k}")

    await asyncio.gather(*(request(k) for k in range(3)))
    assert order == ["work 0", "pass after 0", "work 1", "pass after 1", "work 2", "pass after 2"]
