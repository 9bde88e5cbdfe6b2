"""OpenRouter's prompt caching in the simulator, as its prompt-caching guide describes it: each
provider endpoint's prefix cache (hit within its lifetime, missed after it or after eviction),
the bill with the provider's read and write multipliers, the fields usage, /generation and the
catalogue carry, and sticky routing (by conversation hash and by `session_id`, 10 minutes, not
with `provider.order`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from regen.sim import RunningSim, SimConfig, SimEndpoint, SimModel
from regen.sim.config import SimCache
from regen.sim.prefix_cache import PrefixCache
from regen.sim.server import Simulator, computed_by, start_sim
from tests.sim.helpers import get, post, stream, turns

KIMI = "moonshotai/kimi-k2.5"


@asynccontextmanager
async def served(config: SimConfig) -> AsyncIterator[RunningSim]:
    running, runner = await start_sim(config)
    try:
        yield running
    finally:
        await runner.cleanup()


def ask(messages: list[dict[str, Any]], model: str = KIMI, **kw: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 64, "messages": messages, **kw}


def two_providers(**cache: Any) -> SimConfig:
    """One model at two equally priced caching endpoints: the default balancing splits
    conversations between them, so only stickiness keeps one on its endpoint."""
    ep = {"prompt_price": 1e-6, "completion_price": 2e-6, "cache": SimCache(**cache)}
    return SimConfig(
        seed=3,
        time_scale=0,
        generation_delay_s=0,
        faults={"padding": 0, "keepalive": 0},  # type: ignore[arg-type]
        models=[
            SimModel(
                id=KIMI,
                mean_completion_tokens=20,
                endpoints=[
                    SimEndpoint(provider_name="A", tag="a", **ep),
                    SimEndpoint(provider_name="B", tag="b", **ep),
                ],
            )
        ],
    )


def caching(**kw: Any) -> SimConfig:
    return SimConfig(seed=1, time_scale=0, generation_delay_s=0, prompt_caching=True, **kw)


async def test_a_repeated_prefix_is_read_within_its_lifetime_and_missed_after_it() -> None:
    async with served(caching()) as sim:
        only = {"only": ["moonshotai"]}
        _, first, _ = await post(sim, ask(turns(1, 1), provider=only))
        _, second, _ = await post(sim, ask(turns(1, 2), provider=only))
        sim.simulator.clock.advance(301)  # Moonshot's cache lives 300 s after its last use
        _, third, _ = await post(sim, ask(turns(1, 3), provider=only))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Whole 64-token blocks of the first turn's prompt, which the second turn repeats.
    assert cached == first["usage"]["prompt_tokens"] // 64 * 64 > 0
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_a_prefix_evicted_by_others_is_missed() -> None:
    config = two_providers(read_multiplier=0.25, block_tokens=16, capacity_tokens=400)
    async with served(config) as sim:
        only = {"only": ["a"]}
        _, first, _ = await post(sim, ask(turns(1, 1), provider=only))
        _, hit, _ = await post(
            sim, ask(turns(1, 1) + [{"role": "user", "content": "x"}], provider=only)
        )
        for other in (2, 3):  # two other conversations fill the 400 tokens
            await post(sim, ask(turns(other, 1), provider=only))
        _, miss, _ = await post(sim, ask(turns(1, 2), provider=only))
    assert first["usage"]["prompt_tokens"] < 400
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert miss["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def bill(usage: dict[str, Any], price: float, read: float, write: float, out: float) -> float:
    """The documented formula: cached tokens at read x the prompt price, written ones at
    write x, the rest at the prompt price, plus the completion."""
    details = usage["prompt_tokens_details"]
    cached, written = details["cached_tokens"], details["cache_write_tokens"]
    fresh = usage["prompt_tokens"] - cached - written
    return price * (fresh + cached * read + written * write) + out * usage["completion_tokens"]


@pytest.mark.parametrize(
    ("model", "tag", "read", "write"),
    [
        (KIMI, "moonshotai", 0.25, 1.0),
        ("deepseek/deepseek-chat-v3", "deepseek", 0.1, 1.0),
        ("qwen/qwen3-coder", "alibaba", 0.1, 1.25),
    ],
)
async def test_the_bill_uses_the_providers_read_and_write_multipliers(
    model: str, tag: str, read: float, write: float
) -> None:
    config = caching()
    m = config.model(model)
    assert m is not None
    ep = next(e for e in m.endpoints if e.tag == tag)
    async with served(config) as sim:
        only = {"only": [tag]}
        answers = [
            (await post(sim, ask(turns(5, k), model=model, provider=only)))[1] for k in (1, 2)
        ]
        gens = [(await get(sim, f"/generation?id={a['id']}"))[1]["data"] for a in answers]
        _, catalogue = await get(sim, f"/models/{model}/endpoints")
    for answer, gen in zip(answers, gens, strict=True):
        usage = answer["usage"]
        cost = bill(usage, ep.prompt_price, read, write, ep.completion_price)
        assert usage["cost"] == pytest.approx(cost, rel=1e-9)
        assert gen["total_cost"] == pytest.approx(cost, rel=1e-9)
        full = (
            usage["prompt_tokens"] * ep.prompt_price
            + usage["completion_tokens"] * ep.completion_price
        )
        assert gen["cache_discount"] == pytest.approx(full - cost, rel=1e-6, abs=1e-15)
        assert gen["native_tokens_cached"] == usage["prompt_tokens_details"]["cached_tokens"]
    first, second = (a["usage"]["prompt_tokens_details"] for a in answers)
    assert first["cached_tokens"] == 0 and second["cached_tokens"] > 0
    # Writes are billed (and counted) only where the provider prices them apart.
    assert (first["cache_write_tokens"] > 0) == (write != 1)
    pricing = catalogue["data"]["endpoints"][0]["pricing"]
    assert float(pricing["input_cache_read"]) == pytest.approx(ep.prompt_price * read)
    assert ("input_cache_write" in pricing) == (write != 1)
    if write != 1:
        assert float(pricing["input_cache_write"]) == pytest.approx(ep.prompt_price * write)
        assert gens[0]["cache_discount"] < 0  # the first turn only wrote: it cost more
    assert catalogue["data"]["endpoints"][0]["supports_implicit_caching"] is True


async def test_a_stream_carries_the_cached_tokens_in_its_usage() -> None:
    async with served(caching()) as sim:
        only = {"only": ["moonshotai"]}
        await post(sim, ask(turns(7, 1), provider=only))
        _, lines = await stream(sim, ask(turns(7, 2), provider=only))
    usage = [c for c in lines if '"usage"' in c][-1]
    assert '"cached_tokens": 0' not in usage and '"cached_tokens": ' in usage


async def test_without_caching_configured_nothing_is_cached_or_listed() -> None:
    async with served(SimConfig(seed=1, time_scale=0)) as sim:
        only = {"only": ["moonshotai"]}
        await post(sim, ask(turns(1, 1), provider=only))
        _, again, _ = await post(sim, ask(turns(1, 2), provider=only))
        _, catalogue = await get(sim, f"/models/{KIMI}/endpoints")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for ep in catalogue["data"]["endpoints"]:
        assert "input_cache_read" not in ep["pricing"] and not ep["supports_implicit_caching"]


async def providers_of(sim: RunningSim, asks: list[dict[str, Any]], **headers: str) -> list[str]:
    out = []
    async with aiohttp.ClientSession() as s:
        for data in asks:
            url = f"{sim.base_url}/chat/completions"
            async with s.post(
                url, json=data, headers={"Authorization": "Bearer k", **headers}
            ) as r:
                out.append((await r.json())["provider"])
    return out


CONVS = range(24)


async def test_sticky_routing_keeps_a_conversation_on_its_provider_for_ten_minutes() -> None:
    async with served(two_providers(read_multiplier=0.25)) as sim:
        clock = sim.simulator.clock
        first = await providers_of(sim, [ask(turns(c, 1)) for c in CONVS])
        second = await providers_of(sim, [ask(turns(c, 2)) for c in CONVS])
        clock.advance(599)
        third = await providers_of(sim, [ask(turns(c, 3)) for c in CONVS])
        clock.advance(601)  # ten minutes without a request: the routes are forgotten
        fourth = await providers_of(sim, [ask(turns(c, 4)) for c in CONVS])
    assert set(first) == {"A", "B"}  # balanced: conversations start on both
    assert second == first and third == first
    assert fourth != first


async def test_sticky_routing_by_session_id_header_or_prompt_cache_key() -> None:
    async with served(two_providers(read_multiplier=0.25)) as sim:
        # Unrelated prompts: only the session ties them together.
        by_body = await providers_of(sim, [ask(turns(c, 1), session_id="s1") for c in CONVS])
        by_header = await providers_of(
            sim, [ask(turns(100 + c, 1)) for c in CONVS], **{"x-session-id": "s2"}
        )
        by_key = await providers_of(
            sim, [ask(turns(200 + c, 1), prompt_cache_key="s3") for c in CONVS]
        )
        apart = await providers_of(sim, [ask(turns(300 + c, 1)) for c in CONVS])
    assert len(set(by_body)) == len(set(by_header)) == len(set(by_key)) == 1
    assert set(apart) == {"A", "B"}


async def test_no_sticky_routing_with_provider_order() -> None:
    async with served(two_providers(read_multiplier=0.25)) as sim:
        first = await providers_of(sim, [ask(turns(c, 1)) for c in CONVS])
        # An explicit order wins over the sticky route...
        ordered = await providers_of(
            sim, [ask(turns(c, 2), provider={"order": ["b"]}) for c in CONVS]
        )
        # ...and a request with one leaves no sticky route of its own.
        pinned = await providers_of(
            sim, [ask(turns(50 + c, 1), provider={"order": ["b"]}) for c in CONVS]
        )
        after = await providers_of(sim, [ask(turns(50 + c, 2)) for c in CONVS])
    assert set(first) == {"A", "B"}
    assert set(ordered) == {"B"} and set(pinned) == {"B"}
    assert set(after) == {"A", "B"}


async def test_no_sticky_routing_where_cache_reads_cost_the_full_price() -> None:
    async with served(two_providers(read_multiplier=1.0)) as sim:
        first = await providers_of(sim, [ask(turns(c, 1)) for c in CONVS])
        second = await providers_of(sim, [ask(turns(c, 2)) for c in CONVS])
    assert second != first


def test_sim_clock_stands_still_at_time_scale_zero_and_advances_on_request() -> None:
    sim = Simulator(SimConfig(time_scale=0))
    start = sim.clock.now()
    sim.clock.advance(42)
    assert sim.clock.now() == start + 42


def test_expired_blocks_are_dropped_not_kept_until_the_capacity_is_full() -> None:
    cache = PrefixCache(block_tokens=4, capacity_tokens=10_000, ttl_s=300)
    cache.use(list(range(40)), now=0)
    cache.use(list(range(100, 140)), now=200)
    assert len(cache) == 20
    cache.use(list(range(200, 240)), now=400)  # the first prompt's blocks outlived 300 s
    assert len(cache) == 20


def test_a_prefix_still_being_computed_is_not_read_and_is_paid_again() -> None:
    """A block is readable once the request that wrote it has computed its prompt: one sent
    meanwhile computes (and writes) it again; one sent after reads it; the earlier of two
    writers makes it readable."""
    cache = PrefixCache(block_tokens=4, capacity_tokens=10_000, ttl_s=300)
    prompt = list(range(40))
    first = cache.use(prompt, now=0, ready=lambda computed: 0 + computed / 10)  # at 4.0
    assert (first.cached, first.written) == (0, 40)
    meanwhile = cache.use(prompt, now=1, ready=lambda computed: 1 + computed / 2)  # at 21.0
    assert (meanwhile.cached, meanwhile.written) == (0, 40)
    after = cache.use([*prompt, 99], now=4, ready=lambda computed: 4.0)
    assert (after.cached, after.written) == (40, 0)
    at_once = cache.use(list(range(50, 90)), now=5)  # no `ready`: readable at once
    assert at_once.written == 40 and cache.use(list(range(50, 90)), now=5).cached == 36


def test_a_prompt_is_computed_after_its_time_to_first_token_on_the_sim_clock() -> None:
    endpoint = SimEndpoint(provider_name="A", tag="a", ttft_s=0.5, prefill_tokens_per_s=100.0)
    moving = Simulator(SimConfig(time_scale=1.0))
    start = moving.clock.now()
    assert computed_by(moving.clock, endpoint)(200) >= start + 2.5
    still = Simulator(SimConfig(time_scale=0))  # the clock stands still: work takes no time
    assert computed_by(still.clock, endpoint)(200) == still.clock.now()


async def test_a_hit_shortens_the_time_to_first_token() -> None:
    config = two_providers(read_multiplier=0.25)
    model = config.models[0]
    fast = [e.model_copy(update={"prefill_tokens_per_s": 1000.0}) for e in model.endpoints]
    config = config.model_copy(update={"models": [model.model_copy(update={"endpoints": fast})]})
    async with served(config) as sim:
        answers = [(await post(sim, ask(turns(9, k))))[1] for k in (1, 2)]
        gens = [(await get(sim, f"/generation?id={a['id']}"))[1]["data"] for a in answers]
        cold, warm = sim.simulator.chat_log()
    assert cold.ttft_s == pytest.approx(0.2 + cold.prompt_tokens / 1000)
    assert warm.ttft_s == pytest.approx(0.2 + (warm.prompt_tokens - warm.cached_tokens) / 1000)
    assert [g["latency"] for g in gens] == pytest.approx([cold.ttft_s * 1000, warm.ttft_s * 1000])


async def test_idle_sticky_routes_are_dropped() -> None:
    async with served(two_providers(read_multiplier=0.25)) as sim:
        await providers_of(sim, [ask(turns(c, 1)) for c in CONVS])
        held = sim.simulator.caches.sticky_routes()
        sim.simulator.clock.advance(601)
        await providers_of(sim, [ask(turns(1000, 1))])
    assert held == len(CONVS)
    assert sim.simulator.caches.sticky_routes() == 1
