"""Credits, /key, /credits, /generation, 402; capacity and platform 429s."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from regen.sim import SimConfig, SimEndpoint, SimModel, sim_in_thread
from tests.sim.helpers import body, get, headers, post


async def test_key_and_credits_report_the_balance_and_guard_credits() -> None:
    cfg = SimConfig(time_scale=0, credits_usd=5.0, management_keys=["sk-mgmt-0123456789"])
    with sim_in_thread(cfg) as sim:
        status, _, _ = await post(sim, body(), key="sk-or-v1-abcdefghijklmnop")
        assert status == 200
        spent = sim.simulator.billed_usd()
        status, data = await get(sim, "/key", key="sk-or-v1-abcdefghijklmnop")
        d = data["data"]
        assert (d["limit"], d["usage"]) == (5.0, pytest.approx(spent))
        assert d["limit_remaining"] == pytest.approx(5.0 - spent)
        assert "abcdefghijklmnop" not in d["label"]
        # Another key of the account: its own usage (none), the account's credit as limit.
        status, data = await get(sim, "/key", key="sk-or-v1-another-key-000")
        d = data["data"]
        assert (d["limit"], d["usage"], d["usage_daily"]) == (5.0, 0, 0)
        assert d["limit_remaining"] == pytest.approx(5.0 - spent)
        status, data = await get(sim, "/credits", key="sk-or-v1-abcdefghijklmnop")
        assert status == 403 and "management keys" in data["error"]["message"]
        status, data = await get(sim, "/credits", key="sk-mgmt-0123456789")
        assert data["data"] == {"total_credits": 5.0, "total_usage": pytest.approx(spent)}
        assert (await get(sim, "/key", key=None))[0] == 401


async def test_402_when_credit_cannot_cover_max_tokens_and_balance_falls() -> None:
    # kimi's priciest completion is 2.5 $/Mtok: 10,000 max_tokens cost at most $0.025.
    with sim_in_thread(SimConfig(time_scale=0, credits_usd=0.03)) as sim:
        statuses = []
        for i in range(40):
            status, data, _ = await post(
                sim, body(f"q{i}", max_tokens=10_000, provider={"sort": "price"})
            )
            statuses.append(status)
            if status == 402:
                assert "requires more credits, or fewer max_tokens" in data["error"]["message"]
                assert "You requested up to 10000 tokens" in data["error"]["message"]
                break
        assert statuses[0] == 200 and statuses[-1] == 402
        assert sim.simulator.account.remaining_usd is not None
        assert 0 < sim.simulator.account.remaining_usd < 0.03
        # A smaller max_tokens is still affordable.
        status, _, _ = await post(sim, body("small", max_tokens=50))
        assert status == 200


async def test_generation_lags_then_reports_the_billed_usage() -> None:
    with sim_in_thread(SimConfig(time_scale=0, generation_delay_s=0.3)) as sim:
        _, data, _ = await post(sim, body())
        status, _ = await get(sim, f"/generation?id={data['id']}")
        assert status == 404  # not visible yet, as on OpenRouter
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            status, gen = await get(sim, f"/generation?id={data['id']}")
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
        g = gen["data"]
        assert g["provider_name"] == data["provider"]
        assert g["native_tokens_completion"] == data["usage"]["completion_tokens"]
        assert g["total_cost"] == pytest.approx(data["usage"]["cost"])


async def test_endpoints_and_providers_catalogue(sim) -> None:  # type: ignore[no-untyped-def]
    status, data = await get(sim, "/models/moonshotai/kimi-k2.5/endpoints", key=None)
    assert status == 200
    eps = {e["tag"]: e for e in data["data"]["endpoints"]}
    assert set(eps) == {"moonshotai", "fireworks/fp4", "deepinfra/fp8", "deepinfra/nvfp4"}
    assert eps["deepinfra/nvfp4"]["quantization"] == "nvfp4"
    assert eps["deepinfra/nvfp4"]["provider_name"] == "DeepInfra"
    assert eps["fireworks/fp4"]["pricing"]["completion"] == "0.000002"
    assert eps["moonshotai"]["max_completion_tokens"] == 65536
    assert (await get(sim, "/models/nobody/nothing/endpoints", key=None))[0] == 404
    status, data = await get(sim, "/providers", key=None)
    names = [p["name"] for p in data["data"]]
    assert names == sorted(names) and "DeepInfra" in names
    deepinfra = next(p for p in data["data"] if p["name"] == "DeepInfra")
    assert deepinfra["slug"] == "deepinfra"


def _one_endpoint(capacity: int, **kw: object) -> SimConfig:
    ep = SimEndpoint(
        provider_name="Solo",
        tag="solo",
        ttft_s=0.3,
        tokens_per_s=1e6,
        prompt_price=1e-6,
        completion_price=2e-6,
        capacity=capacity,
    )
    return SimConfig(
        time_scale=1.0, retry_after_s=2, models=[SimModel(id="x/y", endpoints=[ep])], **kw
    )  # type: ignore[arg-type]


async def test_capacity_gives_429_with_retry_after() -> None:
    with sim_in_thread(_one_endpoint(capacity=3)) as sim:
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> tuple[int, str | None]:
                async with s.post(
                    f"{sim.base_url}/chat/completions",
                    json={**body(f"q{i}"), "model": "x/y"},
                    headers=headers(),
                ) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")

            results = await asyncio.gather(*(one(i) for i in range(10)))
        assert sorted(s for s, _ in results).count(200) == 3
        assert {ra for s, ra in results if s == 429} == {"2"}
        assert sim.simulator.max_in_flight["solo"] == 3
        assert sim.simulator.billed_usd() > 0


async def test_global_rps_limit_gives_platform_429_headers() -> None:
    cfg = SimConfig(time_scale=0, global_rps=2)
    with sim_in_thread(cfg) as sim:
        statuses = []
        for i in range(6):
            status, data, hdrs = await post(sim, body(f"q{i}"))
            statuses.append(status)
            if status == 429:
                assert hdrs["X-RateLimit-Remaining"] == "0" and "X-RateLimit-Reset" in hdrs
        assert statuses[:2] == [200, 200] and 429 in statuses
