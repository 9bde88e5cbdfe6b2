"""Every fault kind, forced by header or drawn by rate, seen by a plain aiohttp client."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from regen.sim import RunningSim, SimConfig, SimEndpoint, SimModel, sim_in_thread
from regen.sim.config import SimFaults
from regen.sim.respond import PADDING, PADDING_LINE
from tests.sim.helpers import body, chunks, get, headers, post, post_raw, stream


@pytest.mark.parametrize("code", [500, 502, 503, 524, 529, 408])
async def test_http_error_faults_use_the_error_shape_and_are_not_billed(
    sim: RunningSim, code: int
) -> None:
    status, data, _ = await post(sim, body(), fault=str(code))
    assert status == code and data["error"]["code"] == code
    assert sim.simulator.billed_usd() == 0


async def test_error_in_a_200_body_after_padding(sim: RunningSim) -> None:
    raw = await post_raw(sim, body(), fault="error_200")
    assert raw.startswith(b"\n ")
    data = json.loads(raw)
    assert data["error"]["code"] == 502 and "choices" not in data
    assert sim.simulator.billed_usd() == 0


async def test_padding_before_a_normal_body(sim: RunningSim) -> None:
    raw = await post_raw(sim, body(), fault="padding")
    assert raw[:1].isspace() and json.loads(raw)["choices"][0]["message"]["content"]


async def test_midstream_error_in_a_non_streamed_body(sim: RunningSim) -> None:
    status, data, _ = await post(sim, body(), fault="midstream_error")
    choice = data["choices"][0]
    assert status == 200 and choice["finish_reason"] == "error"
    assert choice["error"]["code"] == 502
    assert sim.simulator.billed_usd() == 0


async def test_cold_start_is_empty_and_free(sim: RunningSim) -> None:
    status, data, _ = await post(sim, body(), fault="cold_start")
    assert status == 200
    assert data["choices"][0]["message"]["content"] == ""
    assert data["usage"]["completion_tokens"] == 0 and data["choices"][0]["finish_reason"] is None
    assert sim.simulator.billed_usd() == 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_reset_cuts_the_connection_mid_body_and_is_billed(
    sim: RunningSim, streamed: bool
) -> None:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.post(
                f"{sim.base_url}/chat/completions",
                json={**body(), "stream": streamed},
                headers={"Authorization": "Bearer k", "X-Sim-Fault": "reset"},
            ) as r:
                assert r.status == 200
                await r.read()
    # Its generation goes on after the cut and is billed when it ends, on the sim's thread.
    assert await asyncio.to_thread(sim.simulator.wait_billed)
    assert sim.simulator.billed_usd() > 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_stall_sends_no_bytes_for_stall_s(streamed: bool) -> None:
    cfg = SimConfig(time_scale=0, faults=SimFaults(stall_s=0.6, padding=0, keepalive=0))
    with sim_in_thread(cfg) as sim:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{sim.base_url}/chat/completions",
                json={**body(), "stream": streamed},
                headers={"Authorization": "Bearer k", "X-Sim-Fault": "stall"},
            ) as r,
        ):
            gaps, last = [], time.monotonic()
            async for _ in r.content.iter_any():
                now = time.monotonic()
                gaps.append(now - last)
                last = now
    assert max(gaps[1:] or gaps) >= 0.55


async def test_stream_shape_matches_the_non_streamed_answer(sim: RunningSim) -> None:
    from tests.sim.helpers import TOOLS

    for i in range(12):
        req = body(f"weather {i}", tools=TOOLS)
        _, whole, _ = await post(sim, req)
        status, lines = await stream(sim, req)
        assert status == 200 and lines[-1] == "data: [DONE]"
        cs = chunks(lines)
        assert all(
            c["object"] == "chat.completion.chunk" and c["id"].startswith("gen-") for c in cs
        )
        finish_at = next(
            j for j, c in enumerate(cs) if c["choices"] and c["choices"][0]["finish_reason"]
        )
        usage = cs[finish_at + 1]  # the usage chunk comes after the finish chunk
        assert finish_at + 2 == len(cs)
        # Same content; the endpoint (and so the price) may differ: load balancing.
        for key in ("prompt_tokens", "completion_tokens", "completion_tokens_details"):
            assert usage["usage"][key] == whole["usage"][key]
        deltas = [c["choices"][0]["delta"] for c in cs[:finish_at]]
        msg = whole["choices"][0]["message"]
        assert "".join(d.get("reasoning") or "" for d in deltas) == msg["reasoning"]
        assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
        args: dict[int, str] = {}
        for d in deltas:
            for tc in d.get("tool_calls") or []:
                args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
        assert list(args.values()) == [
            tc["function"]["arguments"] for tc in msg.get("tool_calls") or []
        ]
        assert cs[finish_at]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


@pytest.mark.parametrize(("style", "expected"), [("empty_choices", 0), ("empty_choice", 1)])
async def test_usage_chunk_styles(style: str, expected: int) -> None:
    cfg = SimConfig(time_scale=0, faults=SimFaults(usage_chunk=style))  # type: ignore[arg-type]
    with sim_in_thread(cfg) as sim:
        _, lines = await stream(sim, body())
    last = chunks(lines)[-1]
    assert "usage" in last and len(last["choices"]) == expected
    if expected:
        assert last["choices"][0]["finish_reason"] is None


async def test_keepalive_comments_in_streams(sim: RunningSim) -> None:
    _, lines = await stream(sim, body("explain code step by step"), fault="keepalive")
    assert lines[0] == ": OPENROUTER PROCESSING"
    assert all(line.startswith(("data: ", ": ")) for line in lines)


async def test_midstream_error_chunk_ends_the_stream(sim: RunningSim) -> None:
    codes = set()
    for i in range(8):
        _, lines = await stream(sim, body(f"explain step by step {i}"), fault="midstream_error")
        assert lines[-1] != "data: [DONE]"
        last = chunks(lines)[-1]
        assert last["choices"][0]["finish_reason"] == "error"
        codes.add(type(last["error"]["code"]))
    assert codes == {int, str}  # OpenRouter sends both
    assert sim.simulator.billed_usd() == 0


async def test_rates_are_deterministic_and_retries_can_succeed() -> None:
    faults = SimFaults(http_5xx=0.5, padding=0, keepalive=0)

    async def statuses() -> list[int]:
        with sim_in_thread(SimConfig(seed=5, time_scale=0, faults=faults)) as sim:
            return [(await post(sim, body(f"q{i % 5}")))[0] for i in range(40)]

    first, second = await statuses(), await statuses()
    assert first == second
    assert set(first) - {200} <= {500, 502, 503, 524, 529} and 200 in first
    assert 8 < first.count(200) < 32
    # The same request, retried, is not doomed: some attempt of each succeeds.
    for q in range(5):
        assert 200 in first[q::5]


async def test_rate_one_fails_every_request_with_listed_codes() -> None:
    faults = SimFaults(http_5xx=1.0, http_5xx_codes=[503])
    with sim_in_thread(SimConfig(time_scale=0, faults=faults)) as sim:
        assert {(await post(sim, body(f"q{i}")))[0] for i in range(5)} == {503}


def _slow(ttft_s: float, time_scale: float, **faults: object) -> SimConfig:
    """One endpoint whose answers take `ttft_s` simulated seconds (their tokens come at once),
    no drawn padding, and /generation visible at once."""
    ep = SimEndpoint(
        provider_name="Slow",
        tag="slow",
        ttft_s=ttft_s,
        tokens_per_s=1e6,
        prompt_price=1e-6,
        completion_price=2e-6,
    )
    return SimConfig(
        time_scale=time_scale,
        generation_delay_s=0,
        faults=SimFaults(padding=0, keepalive=0, **faults),  # type: ignore[arg-type]
        models=[SimModel(id="x/y", endpoints=[ep])],
    )


SLOW = {**body(), "model": "x/y"}


@pytest.mark.slow
async def test_a_json_answer_sends_its_status_and_headers_before_it_is_generated() -> None:
    # A generation of 10,000 real seconds: nothing but the status, headers and padding can
    # arrive while the test looks.
    with sim_in_thread(_slow(10_000, 1.0)) as sim:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{sim.base_url}/chat/completions", json=SLOW, headers=headers()) as r,
        ):
            assert r.status == 200 and r.headers["Content-Type"] == "application/json"
            assert r.headers["X-Generation-Id"].startswith("gen-")
            first = await r.content.readany()
            assert first == PADDING_LINE
            assert sim.simulator.unbilled == 1  # still generating
            # Its id is known, but /generation finds it only once it has ended.
            status, _ = await get(sim, f"/generation?id={r.headers['X-Generation-Id']}")
            assert status == 404
            r.close()


@pytest.mark.parametrize("fault", [None, "padding"])
async def test_padding_every_ten_simulated_seconds_then_the_body(fault: str | None) -> None:
    # 95 simulated seconds: a padding line at once and after 10, 20, ... 90 s (`padding`
    # leads with its 8 lines instead of the first one).
    with sim_in_thread(_slow(95, 0.002)) as sim:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{sim.base_url}/chat/completions", json=SLOW, headers=headers(fault=fault)
            ) as r,
        ):
            raw = await r.read()
            gen_id = r.headers["X-Generation-Id"]
    lead = (8 if fault else 1) + 9
    assert raw.startswith(PADDING_LINE * lead) and raw[len(PADDING_LINE) * lead :][:1] == b"{"
    data = json.loads(raw)
    assert data["id"] == gen_id and data["choices"][0]["message"]["content"]
    assert sim.simulator.billed_usd() > 0


async def test_a_late_error_is_a_200_with_the_generation_header_and_free() -> None:
    with sim_in_thread(_slow(25, 0.002)) as sim:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{sim.base_url}/chat/completions", json=SLOW, headers=headers(fault="error_200")
            ) as r,
        ):
            raw = await r.read()
            gen_id = r.headers["X-Generation-Id"]
        assert r.status == 200 and raw.startswith(PADDING)
        assert json.loads(raw)["error"]["code"] == 502
        assert sim.simulator.billed_usd() == 0 and sim.simulator.unbilled == 0
        status, gen = await get(sim, f"/generation?id={gen_id}")
        assert status == 200 and gen["data"]["total_cost"] == 0


async def test_a_client_gone_during_the_padding_is_billed_when_the_answer_ends() -> None:
    # 50 simulated seconds at time_scale 0.01: half a second, a padding line every 0.1 s.
    with sim_in_thread(_slow(50, 0.01)) as sim:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{sim.base_url}/chat/completions", json=SLOW, headers=headers()) as r,
        ):
            assert await r.content.readany() == PADDING_LINE
            r.close()
        entry = sim.simulator.chat_log()[-1]
        deadline = time.monotonic() + 10
        while entry.status != 499 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert entry.status == 499  # the next padding line found the client gone
        assert await asyncio.to_thread(sim.simulator.wait_billed)
        assert entry.cost_usd > 0 and sim.simulator.billed_usd() == pytest.approx(entry.cost_usd)


@pytest.mark.parametrize("fault", ["reset", "stall", "midstream_error", "cold_start"])
async def test_faults_of_a_json_answer_that_took_time(fault: str) -> None:
    with sim_in_thread(_slow(25, 0.002, stall_s=0.2)) as sim:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(
                    f"{sim.base_url}/chat/completions", json=SLOW, headers=headers(fault=fault)
                ) as r:
                    assert r.status == 200 and r.headers["X-Generation-Id"]
                    raw = await r.read()
            except aiohttp.ClientError:
                assert fault == "reset"
            else:
                assert fault != "reset"
                choice = json.loads(raw)["choices"][0]
                assert raw.startswith(PADDING_LINE * 3)
                if fault == "midstream_error":
                    assert choice["finish_reason"] == "error"
                if fault == "cold_start":
                    assert choice["message"]["content"] == ""
        assert await asyncio.to_thread(sim.simulator.wait_billed)
        billed = sim.simulator.billed_usd()
        assert billed > 0 if fault in ("reset", "stall") else billed == 0


async def test_regen_client_reads_padded_answers_and_late_errors() -> None:
    from regen.engine.client import ChatClient
    from regen.errors import EndpointError

    with sim_in_thread(_slow(35, 0.002)) as sim:
        async with ChatClient(sim.base_url, "k", concurrency=4) as c:
            result = await c.chat("i1", SLOW)
        assert result.message.content and result.generation_id
        assert result.usage.completion_tokens > 0
        late = {"X-Sim-Fault": "error_200"}
        async with ChatClient(sim.base_url, "k", concurrency=4, headers=late) as c:
            with pytest.raises(EndpointError) as info:
                await c.chat("i2", SLOW)
    # An error body (its code is the body's): a failure regen knows was not billed.
    assert info.value.status == 502 and info.value.unbilled and not info.value.maybe_billed
