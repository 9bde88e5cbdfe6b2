"""Paced stream reads over TLS, as against OpenRouter: pausing an SSL transport holds the
decrypted bytes back, and resuming it hands them over in one read."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from regen.engine.client import ChatClient, Timeouts

TLS = Path(__file__).parent / "tls"
BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
WORDS = 60


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(
            {
                "id": "gen-1",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "whole"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def event(obj: object) -> None:
        await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

    for i in range(WORDS):  # one chunk every 10 ms, each in its own TLS record
        await event({"id": "gen-2", "choices": [{"index": 0, "delta": {"content": f"w{i} "}}]})
        await asyncio.sleep(0.01)
    await event({"id": "gen-2", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {"prompt_tokens": 3, "completion_tokens": WORDS, "total_tokens": WORDS + 3}
    await event({"id": "gen-2", "choices": [], "usage": usage})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def tls_url() -> AsyncIterator[str]:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(TLS / "localhost-cert.pem", TLS / "localhost-key.pem")
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def trusting() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(TLS / "localhost-cert.pem"))


async def test_paced_reads_over_tls_take_every_chunk_and_keep_the_connection(
    tls_url: str,
) -> None:
    expected = "".join(f"w{i} " for i in range(WORDS))
    async with ChatClient(tls_url, "k", concurrency=1, ssl_context=trusting()) as c:
        every = await c.chat("a", BODY, stream=True)
        reads = c.stream_reads
        paced = await c.chat("b", BODY, stream=True, timeouts=Timeouts(read_interval_s=0.1))
        paced_reads = c.stream_reads - reads
        # The one pooled connection was left reading: a third request goes through.
        whole = await c.chat("c", BODY, timeouts=Timeouts(read_interval_s=0.1))
    assert every.message.content == paced.message.content == expected
    assert paced.usage.completion_tokens == WORDS and paced.finish_reason == "stop"
    assert paced_reads <= WORDS / 4 < reads  # 600 ms of chunks in reads 100 ms apart
    assert whole.message.content == "whole"


async def test_tls_is_verified(tls_url: str) -> None:
    from regen.errors import EndpointError

    async with ChatClient(tls_url, "k", concurrency=1) as c:  # the system CAs only
        with pytest.raises(EndpointError) as err:
            await c.chat("a", BODY)
    # Not retried (no retry can fix it), and it says what would.
    assert err.value.failure_class == "tls"
    assert "is not trusted" in err.value.message and "SSL_CERT_FILE" in err.value.message
