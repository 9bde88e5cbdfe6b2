from __future__ import annotations

import json
from typing import Any

import aiohttp

from regen.sim import RunningSim, SimConfig, sim_in_thread

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


async def post(sim: RunningSim, body: dict[str, Any], key: str | None = "k") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.base_url}/chat/completions", json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


def body(text: str = "hello", **kw: Any) -> dict[str, Any]:
    return {
        "model": "moonshotai/kimi-k2.5",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": text}],
        **kw,
    }


async def test_response_has_openrouter_shape_and_priced_usage(sim: RunningSim) -> None:
    status, data = await post(sim, body())
    assert status == 200
    assert data["id"].startswith("gen-") and data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert choice["message"]["reasoning"] and choice["message"]["content"]
    u = data["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]
    model = sim.simulator.config.model("moonshotai/kimi-k2.5")
    assert model is not None
    ep = next(e for e in model.endpoints if e.provider_name == data["provider"])
    expected = u["prompt_tokens"] * ep.prompt_price + u["completion_tokens"] * ep.completion_price
    assert abs(u["cost"] - expected) < 1e-9


async def test_same_seed_and_request_give_the_same_response(sim: RunningSim) -> None:
    _, a = await post(sim, body("same"))
    _, b = await post(sim, body("same"))
    _, c = await post(sim, body("different"))
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"] and a["id"] == b["id"]
    assert a["choices"] != c["choices"]
    with sim_in_thread(SimConfig(seed=2, time_scale=0)) as other:
        _, d = await post(other, body("same"))
    assert d["choices"] != a["choices"]


async def test_tools_give_calls_to_declared_functions_with_json_arguments(sim: RunningSim) -> None:
    calls = []
    for i in range(20):
        _, data = await post(sim, body(f"weather please {i}", tools=TOOLS))
        choice = data["choices"][0]
        if choice["finish_reason"] == "tool_calls":
            calls.extend(choice["message"]["tool_calls"])
    assert calls
    for call in calls:
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        assert set(json.loads(call["function"]["arguments"])) == {"city", "days"}


async def test_max_tokens_truncates_with_finish_reason_length(sim: RunningSim) -> None:
    status, data = await post(sim, body("explain step by step", max_tokens=5))
    assert status == 200
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 5


async def test_lengths_depend_on_the_prompt(sim: RunningSim) -> None:
    async def mean(text: str) -> float:
        total = 0
        for i in range(30):
            _, d = await post(sim, body(f"{text} {i}"))
            total += d["usage"]["completion_tokens"]
        return total / 30

    assert await mean("write code to implement and explain a function step by step") > (
        1.5 * await mean("hi")
    )


async def test_auth_model_and_body_errors_use_the_error_shape(sim: RunningSim) -> None:
    status, data = await post(sim, body(), key=None)
    assert (status, data["error"]["code"]) == (401, 401)
    status, data = await post(sim, {**body(), "model": "nope/x"})
    assert status == 400 and "not a valid model ID" in data["error"]["message"]
    status, data = await post(sim, {**body(), "messages": []})
    assert status == 400
    assert [e.status for e in sim.simulator.log] == [401, 400, 400]


async def test_models_lists_prices_as_strings(sim: RunningSim) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.base_url}/models") as r:
        data = (await r.json())["data"]
    kimi = next(m for m in data if m["id"] == "moonshotai/kimi-k2.5")
    assert isinstance(kimi["pricing"]["completion"], str)
    assert float(kimi["pricing"]["completion"]) > 0
