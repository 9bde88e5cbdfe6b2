from __future__ import annotations

import socket

import pytest

from regen.engine.client import ChatClient
from regen.errors import EndpointError
from regen.sim import RunningSim
from tests.conftest import SECRET_KEY
from tests.scripted_server import Reply, scripted_server

BODY = {
    "model": "moonshotai/kimi-k2.5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}


def client(url: str, key: str | None = SECRET_KEY, timeout_s: float = 5.0) -> ChatClient:
    return ChatClient(
        url,
        key,
        concurrency=8,
        timeout_s=timeout_s,
        connect_timeout_s=2.0,
        headers={"X-OpenRouter-Title": "tests"},
    )


async def test_key_is_sent_as_bearer_and_result_parsed(sim: RunningSim) -> None:
    async with client(sim.base_url) as c:
        result = await c.chat("i1", BODY)
    entry = sim.simulator.log[-1]
    assert entry.authorization == f"Bearer {SECRET_KEY}"
    assert result.provider == entry.provider
    assert result.usage.completion_tokens == entry.completion_tokens > 0


async def test_missing_key_is_an_auth_failure(sim: RunningSim) -> None:
    async with client(sim.base_url, key=None) as c:
        with pytest.raises(EndpointError) as info:
            await c.chat("i1", BODY)
    assert info.value.failure_class == "auth" and info.value.status == 401


async def test_http_errors_are_classified_with_retry_after() -> None:
    replies = [
        Reply(429, {"error": {"code": 429, "message": "rate"}}, {"Retry-After": "4"}),
        Reply(503, "<html>bad gateway</html>"),
        Reply(400, {"error": {"code": 400, "message": "bad model"}}),
    ]
    async with scripted_server(lambda n, _: replies[n]) as srv, client(srv.url) as c:
        seen = []
        for _ in replies:
            with pytest.raises(EndpointError) as info:
                await c.chat("i", BODY)
            seen.append((info.value.failure_class, info.value.status, info.value.retry_after_s))
    assert seen == [
        ("rate_limited", 429, 4.0),
        ("overloaded", 503, None),
        ("bad_request", 400, None),
    ]
    assert srv.headers[0]["X-OpenRouter-Title"] == "tests"


async def test_timeout_and_connection_refused_are_classified() -> None:
    async with (
        scripted_server(lambda n, _: Reply(delay_s=2.0)) as srv,
        client(srv.url, timeout_s=0.3) as c,
    ):
        with pytest.raises(EndpointError) as info:
            await c.chat("i", BODY)
    assert info.value.failure_class == "timeout"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with client(f"http://127.0.0.1:{port}/v1") as c:
        with pytest.raises(EndpointError) as info:
            await c.chat("i", BODY)
    assert info.value.failure_class == "connection"
    assert SECRET_KEY not in str(info.value)


async def test_errors_name_their_cause() -> None:
    """Nothing listening, or a web page where the API should be: one line that says so and
    what to check."""
    from regen.errors import EndpointError
    from tests.scripted_server import Reply, scripted_server

    async with ChatClient("http://127.0.0.1:9/v1", "k", concurrency=1) as c:
        with pytest.raises(EndpointError) as refused:
            await c.chat("a", {"model": "m", "messages": []})
    assert refused.value.failure_class == "connection"
    assert refused.value.message.startswith("cannot connect to 127.0.0.1:9: ")
    assert "is [endpoint].base_url right?" in refused.value.message

    page = "<!DOCTYPE html><html><body>Welcome to nginx!</body></html>"
    replies = [Reply(200, page), Reply(404, page)]
    async with (
        scripted_server(lambda n, _: replies[n]) as srv,
        ChatClient(srv.url, "k", concurrency=1) as c,
    ):
        for status in (200, 404):
            with pytest.raises(EndpointError) as html:
                await c.chat("a", {"model": "m", "messages": []})
            assert html.value.status == status
            assert "HTML page" in html.value.message and "/api/v1 or /v1" in html.value.message
