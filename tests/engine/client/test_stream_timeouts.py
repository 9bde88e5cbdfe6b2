"""A stream ends with its true cause: one whose bytes keep coming ends at the attempt's total
time as `timeout`, one that falls silent ends as `stalled`, whichever limit a read waits on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from regen.engine.client import ChatClient, Timeouts
from regen.errors import EndpointError

BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CHUNK = {"id": "gen-1", "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]}


async def _endless(request: web.Request) -> web.StreamResponse:
    """`kind` keepalive: a comment every 20 ms, forever; tiny: a token every 20 ms, forever;
    silent: one token, then nothing; headers: the headers, then nothing."""
    kind = request.match_info["kind"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if kind == "headers":
        await asyncio.sleep(3600)
    await resp.write(f"data: {json.dumps(CHUNK)}\n\n".encode())
    while True:
        if kind == "silent":
            await asyncio.sleep(3600)
        await asyncio.sleep(0.02)
        piece = b": OPENROUTER PROCESSING\n\n" if kind == "keepalive" else b"data: "
        piece += json.dumps(CHUNK).encode() + b"\n\n" if kind == "tiny" else b""
        await resp.write(piece)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{kind}/chat/completions", _endless)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _fails(url: str, kind: str, t: Timeouts) -> EndpointError:
    async with ChatClient(f"{url}/{kind}", "k", concurrency=1) as client:
        with pytest.raises(EndpointError) as info:
            await asyncio.wait_for(client.chat("i", BODY, stream=True, timeouts=t), 30)
    return info.value


@pytest.mark.parametrize("kind", ["keepalive", "tiny"])
@pytest.mark.parametrize("pace", [0.0, 0.25], ids=["every-chunk", "paced"])
async def test_a_stream_that_never_ends_is_a_total_timeout(
    server: str, kind: str, pace: float
) -> None:
    err = await _fails(server, kind, Timeouts(total_s=0.6, idle_s=60, read_interval_s=pace))
    assert (err.failure_class, err.message) == ("timeout", "request took over 0.6 s")
    assert err.maybe_billed and err.generation_id == "gen-1"  # it had begun: it may be billed


async def test_a_silent_stream_is_still_stalled(server: str) -> None:
    err = await _fails(server, "silent", Timeouts(total_s=20, idle_s=0.3, read_interval_s=0.25))
    assert (err.failure_class, err.message) == ("stalled", "no bytes for 0.3 s")


async def test_headers_then_nothing_within_a_shorter_total_is_the_total(server: str) -> None:
    err = await _fails(server, "headers", Timeouts(total_s=0.4, ttfb_s=60))
    assert (err.failure_class, err.message) == ("timeout", "request took over 0.4 s")
    err = await _fails(server, "headers", Timeouts(total_s=60, ttfb_s=0.3))
    assert (err.failure_class, err.message) == ("timeout", "no bytes within 0.3 s")
