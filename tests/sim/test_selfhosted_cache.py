"""A self-hosted vLLM or SGLang server's automatic prefix cache in the simulator: a repeated
prefix is found (block by block, LRU within the KV cache's capacity), its tokens are not
computed again (shorter prefill, counted in /_sim/stats), and `cached_tokens` is reported as
each server reports it, only with its switch on."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from regen.sim import RunningSim, SimConfig, SimEndpoint, SimModel
from regen.sim.server import start_sim
from tests.sim.helpers import turns

MODEL = "qwen/qwen3-8b"
PREFILL_TPS = 2000.0


def config(dialect: str, time_scale: float = 0.0, **kw: Any) -> SimConfig:
    speed = SimEndpoint(
        provider_name="local", tag="local", ttft_s=0.05, tokens_per_s=1e6,
        prefill_tokens_per_s=PREFILL_TPS,
    )  # fmt: skip
    model = SimModel(id=MODEL, family="qwen3", mean_completion_tokens=8, endpoints=[speed])
    return SimConfig(
        dialect=dialect,  # type: ignore[arg-type]
        time_scale=time_scale,
        seed=4,
        models=[model],
        log_bodies=True,
        **kw,
    )


@asynccontextmanager
async def served(cfg: SimConfig) -> AsyncIterator[RunningSim]:
    running, runner = await start_sim(cfg)
    try:
        yield running
    finally:
        await runner.cleanup()


async def chat(sim: RunningSim, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    data = {"model": MODEL, "messages": messages, "max_tokens": 16, **kw}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{sim.port}/v1/chat/completions", json=data) as r,
    ):
        assert r.status == 200, await r.text()
        if not kw.get("stream"):
            out: dict[str, Any] = await r.json()
            return out
        lines = (await r.text()).splitlines()
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    return next(c for c in chunks if c.get("usage") and not c["choices"])


async def stats(sim: RunningSim) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{sim.port}/_sim/stats") as r,
    ):
        out: dict[str, Any] = await r.json()
        return out


@pytest.mark.parametrize(("dialect", "block"), [("vllm", 16), ("sglang", 1)])
async def test_a_hit_skips_the_cached_prefill_and_is_counted(dialect: str, block: int) -> None:
    async with served(config(dialect)) as sim:
        await chat(sim, turns(1, 1))
        await chat(sim, turns(1, 2))
        totals = await stats(sim)
        first, second = sim.simulator.chat_log()
    assert first.cached_tokens == 0
    # The first turn's prompt (its whole blocks), which the second turn's begins with.
    assert second.cached_tokens == first.prompt_tokens // block * block > 0
    assert first.ttft_s == pytest.approx(0.05 + first.prompt_tokens / PREFILL_TPS)
    computed = second.prompt_tokens - second.cached_tokens
    assert second.ttft_s == pytest.approx(0.05 + computed / PREFILL_TPS)
    assert totals["prefill_tokens"] == first.prompt_tokens + computed
    assert totals["cached_tokens"] == second.cached_tokens
    assert totals["prefill_tokens_by_endpoint"] == {"local": totals["prefill_tokens"]}


async def test_the_prefill_time_is_waited_for() -> None:
    # A prompt of some 400 tokens at 2000 a second: 0.2 s, bounded from below whatever the load.
    cfg = config("vllm", time_scale=1.0)
    async with served(cfg) as sim:
        messages = turns(2, 3)
        start = time.monotonic()
        await chat(sim, messages)
        cold = time.monotonic() - start
        (miss,) = sim.simulator.chat_log()
    assert miss.prompt_tokens / PREFILL_TPS > 0.15
    assert cold >= miss.ttft_s


async def test_eviction_and_the_switch_off_mean_misses() -> None:
    async with served(config("vllm", prefix_cache_tokens=400)) as small:
        await chat(small, turns(1, 1))
        for other in (2, 3):  # two other conversations fill the 400 tokens
            await chat(small, turns(other, 1))
        await chat(small, turns(1, 2))
    assert small.simulator.chat_log()[-1].cached_tokens == 0
    async with served(config("sglang", prefix_caching=False)) as off:
        await chat(off, turns(1, 1))
        await chat(off, turns(1, 2))
    assert off.simulator.chat_log()[-1].cached_tokens == 0


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_cached_tokens_are_reported_only_with_the_servers_switch(dialect: str) -> None:
    async with served(config(dialect)) as quiet:
        await chat(quiet, turns(1, 1))
        silent = await chat(quiet, turns(1, 2))
    assert silent["usage"]["prompt_tokens_details"] is None
    async with served(config(dialect, report_cached_tokens=True)) as sim:
        cold = await chat(sim, turns(1, 1))
        warm = await chat(sim, turns(1, 2))
        streamed = await chat(sim, turns(1, 3), stream=True, stream_options={"include_usage": True})
        hits = [e.cached_tokens for e in sim.simulator.chat_log()]
    # vLLM reports 0 too; SGLang leaves the details out when nothing was cached.
    assert cold["usage"]["prompt_tokens_details"] == (
        {"cached_tokens": 0} if dialect == "vllm" else None
    )
    assert warm["usage"]["prompt_tokens_details"] == {"cached_tokens": hits[1]}
    assert streamed["usage"]["prompt_tokens_details"] == {"cached_tokens": hits[2]}
    assert 0 < hits[1] < hits[2]


async def test_n_samples_are_one_prefill_and_a_repeat_reads_all_but_the_last_block() -> None:
    async with served(config("vllm")) as sim:
        await chat(sim, turns(3, 1), n=4)
        await chat(sim, turns(3, 1), n=4, seed=1)
        totals = await stats(sim)
        first, again = sim.simulator.chat_log()
    computed = again.prompt_tokens - again.cached_tokens
    assert totals["prefill_tokens"] == first.prompt_tokens + computed
    assert again.cached_tokens == (again.prompt_tokens - 1) // 16 * 16
