"""The simulator's vLLM and SGLang dialects keep to what each server documents and implements
(the shapes below are the servers' own, read from their protocol and serving code; see
docs/sim.md): routes, errors, token ids, usage in streams, the refusal of ids on SGLang
streams, and what regen's client makes of each."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from regen.engine.client.http import ChatClient
from regen.errors import EndpointError
from regen.sim import SimConfig
from regen.sim.server import start_sim

MODEL = "qwen/qwen3-8b"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}


async def serve(dialect: str, **kw: Any) -> Any:
    config = SimConfig(dialect=dialect, served_model=MODEL, time_scale=0.0, seed=2, **kw)  # type: ignore[arg-type]
    return await start_sim(config)


def events(raw: str) -> list[Any]:
    out = []
    for line in raw.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_vllm_routes_errors_and_ids() -> None:
    running, runner = await serve("vllm")
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/health") as r:
                assert r.status == 200 and await r.read() == b""
            async with http.get(f"{base}/v1/models") as r:
                card = (await r.json())["data"][0]
                assert (card["id"], card["owned_by"], card["object"]) == (MODEL, "vllm", "model")
            for path in ("/api/v1/key", "/v1/credits", "/v1/generation?id=x"):
                async with http.get(base + path) as r:
                    assert r.status == 404  # no account, no credits, no generation records
            async with http.post(f"{base}/v1/chat/completions", json={**ASK, "model": "x"}) as r:
                assert r.status == 404
                assert await r.json() == {
                    "error": {
                        "message": "The model `x` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                }
            body = {**ASK, "return_token_ids": True}
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                done = await r.json()
            choice = done["choices"][0]
            assert done["id"].startswith("chatcmpl-") and "cost" not in done["usage"]
            assert "provider" not in done
            assert len(choice["token_ids"]) == done["usage"]["completion_tokens"]
            assert len(done["prompt_token_ids"]) == done["usage"]["prompt_tokens"]
            assert "reasoning" in choice["message"] and "reasoning_content" not in choice["message"]
            stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with http.post(f"{base}/v1/chat/completions", json=stream) as r:
                chunks = events(await r.text())
            assert chunks[-1] == "[DONE]"
            first, *middle, usage, _ = chunks
            assert first["prompt_token_ids"] == done["prompt_token_ids"]
            assert "usage" not in first  # vLLM leaves unset fields out of chunks
            joined = [t for c in middle for t in c["choices"][0]["token_ids"]]
            assert joined == choice["token_ids"]
            assert middle[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
            assert usage["choices"] == [] and usage["usage"] == done["usage"]
            quiet = {**body, "stream": True}
            async with http.post(f"{base}/v1/chat/completions", json=quiet) as r:
                assert all("usage" not in c for c in events(await r.text())[:-1])
    finally:
        await runner.cleanup()


async def test_sglang_refuses_ids_on_streams_and_answers_errors_flat() -> None:
    running, runner = await serve("sglang")
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            body = {**ASK, "stream": True, "return_token_ids": True}
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                assert r.status == 400
                error = await r.json()
            assert error["object"] == "error" and error["code"] == 400
            assert error["message"].startswith("return_token_ids is not supported with streaming")
            # The name is not checked: SGLang answers with the model the request named.
            named = {**ASK, "model": "default", "return_token_ids": True}
            named["return_prompt_token_ids"] = True
            async with http.post(f"{base}/v1/chat/completions", json=named) as r:
                done = await r.json()
            choice = done["choices"][0]
            assert done["model"] == "default" and not done["id"].startswith("chatcmpl-")
            assert "reasoning_content" in choice["message"] and "matched_stop" in choice
            assert len(choice["token_ids"]) == done["usage"]["completion_tokens"]
            assert len(choice["prompt_token_ids"]) == done["usage"]["prompt_tokens"]
            assert "reasoning_tokens" in done["usage"]
            stream = {**ASK, "stream": True, "stream_options": {"include_usage": True}}
            async with http.post(f"{base}/v1/chat/completions", json=stream) as r:
                chunks = events(await r.text())
            finish = chunks[-3]["choices"][0]
            assert finish["finish_reason"] is not None and "matched_stop" in finish
            assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] > 0
        async with ChatClient(running.base_url, None, concurrency=2) as client:
            with pytest.raises(EndpointError) as caught:
                await client.chat("i", {**ASK, "return_token_ids": True}, stream=True)
        assert caught.value.failure_class == "bad_request"
        assert caught.value.message.startswith("return_token_ids is not supported")
    finally:
        await runner.cleanup()


async def test_sglang_answers_503_while_loading() -> None:
    running, runner = await serve("sglang", loading_s=60.0)
    base = f"http://127.0.0.1:{running.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/health") as r:
                assert r.status == 503
            async with http.post(f"{base}/v1/chat/completions", json=ASK) as r:
                assert r.status == 503
        async with ChatClient(running.base_url, None, concurrency=2) as client:
            assert not await client.probe(f"{base}/health")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("model", "switch", "stop"),
    [
        ("z-ai/glm-4.7", "enable_thinking", "<|user|>"),
        ("minimax/minimax-m2", None, "[e~["),
        ("qwen/qwen3-coder", None, "<|im_end|>"),
        ("qwen/qwen3.5-397b-a17b", "enable_thinking", "<|im_end|>"),
        ("moonshotai/kimi-k3", "thinking", "<|end_of_msg|>"),
        ("meta-llama/llama-4-maverick", None, "<|eot|>"),
    ],
)
async def test_vllm_serves_the_new_families_with_their_switch_and_stop_token(
    model: str, switch: str | None, stop: str
) -> None:
    from regen.sim.grammar import sim_tokenizer

    config = SimConfig(dialect="vllm", served_model=model, time_scale=0.0, seed=2)
    running, runner = await start_sim(config)
    base = f"http://127.0.0.1:{running.port}"
    ask = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
    try:
        async with aiohttp.ClientSession() as http:
            kwargs = [{}] + ([{switch: False}] if switch else [])
            for kw in kwargs:
                body = {**ask, "return_token_ids": True, "chat_template_kwargs": kw}
                async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    done = await r.json()
                choice = done["choices"][0]
                assert choice["finish_reason"] == "stop" and choice["message"]["content"]
                assert choice["token_ids"][-1] == sim_tokenizer().token_to_id(stop)
                thinks = model not in ("qwen/qwen3-coder", "meta-llama/llama-4-maverick")
                thinks = thinks and not kw
                assert bool(choice["message"]["reasoning"]) == thinks
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_n_choices_come_from_one_prompt(dialect: str) -> None:
    """vLLM and SGLang answer `n` with n choices of one prefill: the prompt is counted once,
    the completions summed, each choice a draw of its own."""
    running, runner = await serve(dialect, log_bodies=True)
    url = f"http://127.0.0.1:{running.port}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as http:
            one = {**ASK, "return_token_ids": True, "max_tokens": 200}
            async with http.post(url, json=one) as r:
                single = await r.json()
            async with http.post(url, json={**one, "n": 3}) as r:
                three = await r.json()
            async with http.post(url, json={**one, "n": 2, "stream": True}) as r:
                assert r.status == 400
            async with http.post(url, json={**one, "n": 0}) as r:
                assert r.status == 400
        choices = three["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2]
        assert len({tuple(c["token_ids"]) for c in choices}) == 3
        usage = three["usage"]
        assert usage["prompt_tokens"] == single["usage"]["prompt_tokens"]
        assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
        logged = [e for e in running.simulator.chat_log() if e.status == 200]
        assert logged[-1].choices == 3 and logged[-1].choice_ids == [
            c["token_ids"] for c in choices
        ]
        assert logged[-1].prompt_tokens == usage["prompt_tokens"]  # one prefill
    finally:
        await runner.cleanup()
