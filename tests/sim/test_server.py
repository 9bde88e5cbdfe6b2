from __future__ import annotations

import json

import pytest

from regen.sim import RunningSim, SimConfig, sim_in_thread
from tests.sim.helpers import TOOLS, body, get, post


async def test_response_has_openrouter_shape_and_priced_usage(sim: RunningSim) -> None:
    status, data, hdrs = await post(sim, body())
    assert status == 200
    assert data["id"].startswith("gen-") and data["object"] == "chat.completion"
    assert hdrs["X-Generation-Id"] == data["id"]
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    msg = choice["message"]
    assert msg["reasoning"] and msg["content"]
    assert msg["reasoning_details"][0] == {
        "type": "reasoning.text",
        "text": msg["reasoning"],
        "format": "unknown",
        "index": 0,
    }
    u = data["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]
    entry = sim.simulator.chat_log()[-1]
    model = sim.simulator.config.model("moonshotai/kimi-k2.5")
    assert model is not None
    ep = next(e for e in model.endpoints if e.tag == entry.endpoint_tag)
    assert data["provider"] == ep.provider_name
    expected = u["prompt_tokens"] * ep.prompt_price + u["completion_tokens"] * ep.completion_price
    assert u["cost"] == pytest.approx(expected, abs=1e-11)
    assert sim.simulator.billed_usd() == pytest.approx(expected)


async def test_same_seed_and_request_give_the_same_response(sim: RunningSim) -> None:
    _, a, _ = await post(sim, body("same"))
    _, b, _ = await post(sim, body("same"))
    _, c, _ = await post(sim, body("different"))
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    assert a["id"] != b["id"]  # every request is its own generation
    assert a["choices"] != c["choices"]
    with sim_in_thread(SimConfig(seed=1, time_scale=0)) as again:
        _, d, _ = await post(again, body("same"))
    # The same id but for its clock part (`gen-{unix seconds}-{seeded}`).
    assert d["choices"] == a["choices"] and d["id"].split("-")[2] == a["id"].split("-")[2]
    with sim_in_thread(SimConfig(seed=2, time_scale=0)) as other:
        _, e, _ = await post(other, body("same"))
    assert e["choices"] != a["choices"]


async def test_tools_give_calls_to_declared_functions_with_json_arguments(sim: RunningSim) -> None:
    calls = []
    for i in range(20):
        _, data, _ = await post(sim, body(f"weather please {i}", tools=TOOLS))
        choice = data["choices"][0]
        if choice["finish_reason"] == "tool_calls":
            calls.extend(choice["message"]["tool_calls"])
    assert calls
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        assert call["id"] == "functions.get_weather:0"  # Kimi's own call ids
        assert set(json.loads(call["function"]["arguments"])) == {"city", "days"}


async def test_max_tokens_truncates_with_finish_reason_length(sim: RunningSim) -> None:
    status, data, _ = await post(sim, body("explain step by step", max_tokens=5))
    assert status == 200
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 5
    assert data["choices"][0]["message"]["content"] == ""  # still reasoning when cut


async def test_reasoning_off_and_excluded(sim: RunningSim) -> None:
    _, off, _ = await post(sim, body("q", reasoning={"enabled": False}))
    assert off["choices"][0]["message"]["reasoning"] is None
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    _, hidden, _ = await post(sim, body("q", reasoning={"exclude": True}))
    assert hidden["choices"][0]["message"]["reasoning"] is None
    assert hidden["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0  # still billed


async def test_lengths_depend_on_the_prompt(sim: RunningSim) -> None:
    async def mean(text: str) -> float:
        total = 0
        for i in range(30):
            _, d, _ = await post(sim, body(f"{text} {i}"))
            total += d["usage"]["completion_tokens"]
        return total / 30

    assert await mean("write code to implement and explain a function step by step") > (
        1.5 * await mean("hi")
    )


async def test_auth_model_and_body_errors_use_the_error_shape(sim: RunningSim) -> None:
    status, data, _ = await post(sim, body(), key=None)
    assert (status, data["error"]["code"], data["error"]["message"]) == (
        401,
        401,
        "No auth credentials found",
    )
    status, data, _ = await post(sim, {**body(), "model": "nope/x"})
    assert status == 400 and "not a valid model ID" in data["error"]["message"]
    assert data["error"]["availability"]["code"] == "model_not_found"
    status, data, _ = await post(sim, {**body(), "messages": []})
    assert status == 400
    status, data, _ = await post(sim, body(), fault="gremlins")
    assert status == 400 and "unknown X-Sim-Fault" in data["error"]["message"]
    assert [e.status for e in sim.simulator.chat_log()] == [401, 400, 400, 400]
    assert sim.simulator.billed_usd() == 0


async def test_only_listed_keys_are_accepted_when_configured() -> None:
    with sim_in_thread(SimConfig(time_scale=0, api_keys=["sk-good"])) as sim:
        status, data, _ = await post(sim, body(), key="sk-bad")
        assert (status, data["error"]["message"]) == (401, "User not found.")
        status, _, _ = await post(sim, body(), key="sk-good")
        assert status == 200


async def test_models_list_prices_as_usd_per_token_strings(sim: RunningSim) -> None:
    status, data = await get(sim, "/models", key=None)
    assert status == 200
    kimi = next(m for m in data["data"] if m["id"] == "moonshotai/kimi-k2.5")
    assert kimi["pricing"]["completion"] == "0.0000015"  # the cheapest endpoint
    assert kimi["top_provider"]["max_completion_tokens"] == 65536


NEW_MODELS = {  # model id: (family, provider, reasons by default)
    "z-ai/glm-4.7": ("glm-4.7", "Z.AI", True),
    "minimax/minimax-m2": ("minimax-m2", "MiniMax", True),
    "qwen/qwen3-coder": ("qwen3-coder", "Alibaba", False),
    "qwen/qwen3.5-397b-a17b": ("qwen3.5", "Alibaba", True),
    "moonshotai/kimi-k3": ("kimi-k3", "Moonshot AI", True),
    "meta-llama/llama-4-maverick": ("llama4", "Together", False),
}


@pytest.mark.parametrize("model", sorted(NEW_MODELS))
async def test_new_families_answer_a_tool_loop_end_to_end(sim: RunningSim, model: str) -> None:
    """Each new family's model is in the catalogue and answers a tool loop: calls to the
    declared tool with arguments typed by its schema, then an answer to the tool's result."""
    family, provider, reasons = NEW_MODELS[model]
    config_model = sim.simulator.config.model(model)
    assert config_model is not None and config_model.family == family
    assert config_model.reasoning == reasons
    _, listed = await get(sim, "/models", key=None)
    assert model in {m["id"] for m in listed["data"]}
    ask = None
    for i in range(20):
        ask = body(f"weather please {i}", model=model, tools=TOOLS)
        status, data, _ = await post(sim, ask)
        assert status == 200, data
        assert data["provider"] == provider
        message = data["choices"][0]["message"]
        assert bool(message["reasoning"]) == (reasons and family != "qwen3-coder")
        if data["choices"][0]["finish_reason"] == "tool_calls":
            break
    else:
        raise AssertionError("no tool call in 20 answers")
    assert ask is not None
    [tc] = message["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and tc["id"].startswith("call_")
    args = json.loads(tc["function"]["arguments"])
    if family == "llama4":  # its template writes values as text: the model fills text ones
        assert message["content"] in ("", None) and args == {"city": args["city"]}
    else:
        assert set(args) == {"city", "days"} and isinstance(args["days"], int)
    assert isinstance(args["city"], str)
    follow = {
        **ask,
        "messages": [
            *ask["messages"],
            {k: message[k] for k in ("role", "content", "tool_calls", "reasoning")},
            {"role": "tool", "tool_call_id": tc["id"], "content": "sunny"},
        ],
    }
    status, done, _ = await post(sim, follow)
    assert status == 200, done
    assert done["choices"][0]["finish_reason"] in ("stop", "length")
    assert done["usage"]["prompt_tokens"] > data["usage"]["prompt_tokens"]
    _, off, _ = await post(sim, body("q", model=model, reasoning={"enabled": False}))
    # MiniMax-M2 has no switch: it reasons whatever the request asks.
    assert bool(off["choices"][0]["message"]["reasoning"]) == (family == "minimax-m2")
