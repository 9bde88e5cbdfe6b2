"""The `provider` object, as OpenRouter documents it, over HTTP and in unit form."""

from __future__ import annotations

import random
from typing import Any

from regen.sim import RunningSim, SimConfig
from regen.sim.routing import route
from tests.sim.helpers import body, post

KIMI = SimConfig().models[0].endpoints  # moonshotai, fireworks/fp4, deepinfra/fp8, deepinfra/nvfp4


def tags(provider: Any, max_tokens: int = 1000, params: frozenset[str] = frozenset()) -> list[str]:
    r = route(KIMI, provider, max_tokens=max_tokens, params=set(params), rng=random.Random(0))
    return [e.tag for e in r.endpoints]


def test_ignore_by_endpoint_tag_keeps_the_providers_other_endpoints() -> None:
    assert sorted(tags({"ignore": ["deepinfra/nvfp4"]})) == [
        "deepinfra/fp8",
        "fireworks/fp4",
        "moonshotai",
    ]
    assert sorted(tags({"ignore": ["deepinfra"]})) == ["fireworks/fp4", "moonshotai"]
    assert sorted(tags({"ignore": ["DeepInfra"]})) == ["fireworks/fp4", "moonshotai"]


def test_quantization_allow_list_and_fp4_family() -> None:
    assert sorted(tags({"quantizations": ["fp8", "bf16", "int4"]})) == [
        "deepinfra/fp8",
        "moonshotai",
    ]
    assert sorted(tags({"quantizations": ["fp4"]})) == ["deepinfra/nvfp4", "fireworks/fp4"]


def test_only_order_fallbacks_and_sort() -> None:
    assert tags({"only": ["fireworks", "moonshotai"], "sort": "price"}) == [
        "fireworks/fp4",
        "moonshotai",
    ]
    ordered = tags({"order": ["deepinfra/fp8", "moonshotai"]})
    assert ordered[:2] == ["deepinfra/fp8", "moonshotai"] and len(ordered) == 4
    assert tags({"order": ["deepinfra/fp8"], "allow_fallbacks": False}) == ["deepinfra/fp8"]
    assert tags({"sort": "throughput"})[0] == "fireworks/fp4"
    assert tags({"sort": {"by": "latency"}})[0] == "fireworks/fp4"
    assert tags({"sort": "price"})[0] == "deepinfra/nvfp4"


def test_max_price_is_per_million_tokens_and_max_tokens_filters() -> None:
    assert sorted(tags({"max_price": {"completion": 2.1}})) == ["deepinfra/nvfp4", "fireworks/fp4"]
    assert tags({}, max_tokens=100_000) == []


def test_default_balances_by_inverse_square_price() -> None:
    counts: dict[str, int] = {}
    for seed in range(2000):
        first = route(KIMI, None, max_tokens=10, params=set(), rng=random.Random(seed))
        counts[first.endpoints[0].tag] = counts.get(first.endpoints[0].tag, 0) + 1
    # nvfp4 is the cheapest, so it gets the largest share; every endpoint gets some.
    assert max(counts, key=lambda t: counts[t]) == "deepinfra/nvfp4"
    assert set(counts) == {e.tag for e in KIMI}


async def test_responses_name_the_serving_provider_and_respect_filters(sim: RunningSim) -> None:
    served = set()
    for i in range(20):
        status, data, _ = await post(
            sim,
            body(
                f"q{i}", provider={"ignore": ["deepinfra/nvfp4"], "quantizations": ["fp8", "int4"]}
            ),
        )
        assert status == 200
        served.add(data["provider"])
    assert served <= {"DeepInfra", "Moonshot AI"}
    assert {e.endpoint_tag for e in sim.simulator.chat_log()} <= {"deepinfra/fp8", "moonshotai"}


async def test_filters_that_leave_nothing_give_the_documented_404(sim: RunningSim) -> None:
    status, data, _ = await post(sim, body(provider={"quantizations": ["bf16"]}))
    assert status == 404
    err = data["error"]
    assert err["code"] == 404
    assert err["availability"]["code"] == "constraint_filtered"
    assert err["availability"]["retryable"] is False
    assert err["availability"]["excluded_by"] == ["quantization"]
    assert err["availability"]["constraint"]["field"] == "provider.quantizations"
    status, data, _ = await post(
        sim, body(provider={"order": ["nobody"], "allow_fallbacks": False})
    )
    assert status == 404


async def test_require_parameters_routes_only_to_supporting_endpoints() -> None:
    from regen.sim import SimEndpoint, SimModel, sim_in_thread

    eps = [
        SimEndpoint(provider_name="A", tag="a", supported_parameters=["max_tokens"]),
        SimEndpoint(provider_name="B", tag="b"),
    ]
    cfg = SimConfig(time_scale=0, models=[SimModel(id="x/y", endpoints=eps)])
    with sim_in_thread(cfg) as sim:
        for i in range(10):
            status, data, _ = await post(
                sim,
                {
                    **body(f"q{i}", temperature=0.5),
                    "model": "x/y",
                    "provider": {"require_parameters": True},
                },
            )
            assert status == 200 and data["provider"] == "B"
