"""The client against every simulator fault, streamed and not: one class for each."""

from __future__ import annotations

import pytest

from regen.engine.client import ChatClient, Timeouts
from regen.errors import EndpointError
from regen.sim import RunningSim, SimConfig, sim_in_thread
from regen.sim.config import SimFaults

BODY = {
    "model": "moonshotai/kimi-k2.5",
    "max_tokens": 2048,
    "messages": [{"role": "user", "content": "explain step by step"}],
}


class FaultClient(ChatClient):
    """A ChatClient that asks the simulator for one fault on every request."""

    def __init__(self, url: str, fault: str) -> None:
        super().__init__(url, "k", concurrency=4, headers={"X-Sim-Fault": fault})


async def outcome(sim: RunningSim, fault: str, stream: bool, **t: float) -> str:
    async with FaultClient(sim.base_url, fault) as c:
        try:
            await c.chat("i", BODY, stream=stream, timeouts=Timeouts(**t) if t else None)
        except EndpointError as exc:
            return exc.failure_class
    return "ok"


@pytest.mark.parametrize("stream", [False, True, "paced"])
@pytest.mark.parametrize(
    ("fault", "cls"),
    [
        ("500", "server"),
        ("502", "server"),
        ("503", "overloaded"),
        ("524", "timeout"),
        ("529", "overloaded"),
        ("408", "timeout"),
        ("429", "rate_limited"),
        ("reset", "connection"),
        ("midstream_error", "server"),
        ("cold_start", "invalid_response"),
        ("padding", "ok"),
        ("keepalive", "ok"),
        ("keepalive,padding", "ok"),
    ],
)
async def test_each_fault_has_its_class(
    sim: RunningSim, fault: str, cls: str, stream: bool | str
) -> None:
    if stream == "paced":  # read the stream in batches, the transport paused in between
        assert await outcome(sim, fault, True, read_interval_s=0.02) == cls
    else:
        assert await outcome(sim, fault, bool(stream)) == cls


async def test_error_in_a_200_body(sim: RunningSim) -> None:
    assert await outcome(sim, "error_200", False) == "server"


async def test_a_silent_stream_is_stalled_and_a_slow_start_is_a_timeout() -> None:
    cfg = SimConfig(time_scale=0, faults=SimFaults(stall_s=2.0, keepalive=0, padding=0))
    with sim_in_thread(cfg) as sim:
        assert await outcome(sim, "stall", True, idle_s=0.3) == "stalled"
        # Paced reads do not hide a stall (the pause is at most a quarter of idle_s).
        assert await outcome(sim, "stall", True, idle_s=0.3, read_interval_s=5.0) == "stalled"
    slow = SimConfig(time_scale=1.0, faults=SimFaults(keepalive=0, padding=0))
    with sim_in_thread(slow) as sim:  # time to first token is 0.2-0.4 s here
        assert await outcome(sim, "padding", True, ttfb_s=0.05) == "timeout"
        assert await outcome(sim, "padding", False, total_s=0.05) == "timeout"


async def test_streamed_and_whole_answers_agree(sim: RunningSim) -> None:
    async with ChatClient(sim.base_url, "k", concurrency=2) as c:
        whole = await c.chat("i", BODY)
        streamed = await c.chat("i", BODY, stream=True)
        assert c.chunks_received > 10
    assert streamed.message == whole.message
    assert streamed.usage.completion_tokens == whole.usage.completion_tokens
    assert streamed.finish_reason == whole.finish_reason and streamed.generation_id


async def test_paced_reads_gather_chunks_and_give_the_same_answer() -> None:
    # The simulator paces its chunks (here about 100 a second, over a second or so).
    cfg = SimConfig(time_scale=0.25, faults=SimFaults(keepalive=0, padding=0))
    with sim_in_thread(cfg) as sim:
        async with ChatClient(sim.base_url, "k", concurrency=1) as c:
            every = await c.chat("i", BODY, stream=True)
            reads, chunks = c.stream_reads, c.chunks_received
            paced = await c.chat("i", BODY, stream=True, timeouts=Timeouts(read_interval_s=0.1))
            paced_reads = c.stream_reads - reads
            paced_chunks = c.chunks_received - chunks
    assert paced.message == every.message and paced.usage == every.usage
    assert paced_chunks == chunks > 20
    assert paced_reads <= paced_chunks / 4 < reads  # unpaced: a read per chunk or two


async def test_a_paced_stream_leaves_its_connection_reading() -> None:
    """One pooled connection: after paced streams that end well, by an error inside the
    stream, or by the total timeout during a pause, the next request on it still works."""
    cfg = SimConfig(time_scale=0.25, faults=SimFaults(keepalive=0, padding=0))
    paced = Timeouts(read_interval_s=0.05)
    with sim_in_thread(cfg) as sim:
        async with ChatClient(sim.base_url, "k", concurrency=1) as c:
            await c.chat("i", BODY, stream=True, timeouts=paced)
            with pytest.raises(EndpointError):
                cut = Timeouts(total_s=0.5, read_interval_s=0.2)
                await c.chat("i", BODY, stream=True, timeouts=cut)
            assert (await c.chat("i", BODY, timeouts=paced)).finish_reason
        async with FaultClient(sim.base_url, "midstream_error") as c:
            for _ in range(2):
                with pytest.raises(EndpointError):
                    await c.chat("i", BODY, stream=True, timeouts=paced)
