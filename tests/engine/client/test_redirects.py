"""Redirects: one within the endpoint's own origin is followed; one to another host is refused
in one line (class `redirect`, which stops a run) unless the job lists that host, and nothing
is sent there, the key least of all. Two real servers on 127.0.0.1: the second one is reached
by another name (localhost) and port."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from regen.engine.client import ChatClient
from regen.errors import EndpointError
from tests.conftest import SECRET_KEY, add_to_section, query, run_cli, write_job
from tests.scripted_server import OK_BODY

BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
Route = Callable[[web.Request], web.StreamResponse | None]


@dataclass
class Server:
    """A server on 127.0.0.1 that logs every request and answers with `route`, else with an
    answer (chat) or `{}` (anything else)."""

    route: Route = lambda _request: None  # noqa: E731
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    """Method, path and Authorization header of each request."""
    port: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        raw = await request.read()
        routed = self.route(request)
        if routed is not None:
            return routed
        if request.method != "POST":
            return web.json_response({})
        provider = f"port {self.port}"
        if not json.loads(raw).get("stream"):
            return web.json_response({**OK_BODY, "provider": provider})
        chunk = {"id": "gen-1", "provider": provider, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]
        text = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return web.Response(text=text, content_type="text/event-stream")


@asynccontextmanager
async def serving(server: Server) -> AsyncIterator[Server]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


def redirect_to(base: str, status: int) -> Route:
    def route(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": base + request.path_qs})

    return route


@asynccontextmanager
async def pair(status: int) -> AsyncIterator[tuple[Server, Server]]:
    """`first` redirects every request to `second`, named localhost."""
    second = Server()
    first = Server(lambda request: redirect_to(f"http://localhost:{second.port}", status)(request))
    async with serving(second), serving(first):
        yield first, second


async def chat(first: Server, *, stream: bool = False, follow: tuple[str, ...] = ()) -> str:
    url = f"http://127.0.0.1:{first.port}/v1"
    async with ChatClient(url, SECRET_KEY, concurrency=1, follow_redirects_to=follow) as c:
        result = await c.chat("i", BODY, stream=stream)
    return str(result.provider)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("status", [307, 308, 302])
async def test_a_redirect_to_another_host_is_refused_and_nothing_goes_there(
    status: int, stream: bool
) -> None:
    async with pair(status) as (first, second):
        with pytest.raises(EndpointError) as info:
            await chat(first, stream=stream)
    err = info.value
    assert err.failure_class == "redirect"
    assert err.message == (
        f"HTTP {status} redirect from http://127.0.0.1:{first.port} to "
        f"http://localhost:{second.port}/v1/chat/completions, another host: not followed (the "
        "request would go to, and the answer come from, a server the job does not name); set "
        "[endpoint].base_url to where it points, or list its host in "
        "[endpoint].follow_redirects_to"
    )
    assert not err.maybe_billed  # the redirect was the answer: nothing was generated
    assert second.seen == []
    assert first.seen == [("POST", "/v1/chat/completions", f"Bearer {SECRET_KEY}")]


@pytest.mark.parametrize("status", [307, 308])
async def test_a_listed_host_is_followed_with_the_request_as_it_was(status: int) -> None:
    async with pair(status) as (first, second):
        provider = await chat(first, follow=(f"localhost:{second.port}",))
        assert provider == f"port {second.port}"
        assert await chat(first, follow=("LOCALHOST",), stream=True) == f"port {second.port}"
    assert second.seen[0] == ("POST", "/v1/chat/completions", f"Bearer {SECRET_KEY}")


async def test_a_listed_host_on_another_port_or_a_post_turned_get_is_still_refused() -> None:
    async with pair(307) as (first, second):
        with pytest.raises(EndpointError, match="another host"):
            await chat(first, follow=(f"localhost:{second.port + 1}",))
    async with pair(302) as (first, second):
        with pytest.raises(EndpointError) as info:
            await chat(first, follow=(f"localhost:{second.port}",))
    assert info.value.failure_class == "redirect"
    assert "would turn the request into a GET" in info.value.message
    assert second.seen == []


async def test_a_redirect_within_the_endpoints_own_origin_is_followed() -> None:
    def route(request: web.Request) -> web.StreamResponse | None:
        if request.path.startswith("/old/"):
            return web.Response(status=307, headers={"Location": request.path[4:]})
        return None

    async with serving(Server(route)) as only:
        url = f"http://127.0.0.1:{only.port}/old/v1"
        async with ChatClient(url, SECRET_KEY, concurrency=1) as c:
            result = await c.chat("i", BODY)
            assert result.provider == f"port {only.port}"
            assert await c.get_json("models") == {}
    assert [(m, p) for m, p, _ in only.seen][:2] == [
        ("POST", "/old/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
    ]
    assert {a for _, _, a in only.seen} == {f"Bearer {SECRET_KEY}"}


async def test_a_redirect_loop_ends() -> None:
    def route(request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": request.path})

    async with serving(Server(route)) as loop:
        with pytest.raises(EndpointError) as info:
            await chat(loop)
    assert info.value.failure_class == "redirect"
    assert info.value.message.startswith("more than 5 redirects from ")
    assert len(loop.seen) == 6


async def test_account_reads_do_not_follow_another_host_either() -> None:
    async with pair(307) as (first, second):
        url = f"http://127.0.0.1:{first.port}/v1"
        async with ChatClient(url, SECRET_KEY, concurrency=1) as c:
            assert await c.get_json("key") is None
            why = await c.reach()
            assert await c.probe(f"http://127.0.0.1:{first.port}/health") is False
    assert why is not None and why.startswith("HTTP 307 redirect from ")
    assert second.seen == []


def _job(tmp: Path, first: Server, dialect: str) -> Path:
    url = f"http://127.0.0.1:{first.port}/v1"
    job = write_job(tmp, url, rows=30, extra="stop_grace_s = 5")
    return add_to_section(job, "endpoint", f'dialect = "{dialect}"')


async def test_a_run_whose_endpoint_redirects_elsewhere_stops_once_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    """A self-hosted server that redirects: the first answers stop the run, said once; no
    answer is kept, and nothing (the key least of all) reaches the other host."""
    async with pair(307) as (first, second):
        proc = await _in_thread(run_cli, "run", str(_job(tmp_path, first, "vllm")))
    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = (
        f"error: run stopped: redirect: HTTP 307 redirect from http://127.0.0.1:{first.port} to "
        f"http://localhost:{second.port}/v1/chat/completions, another host"
    )
    assert proc.stderr.startswith(line) and proc.stderr.count("\n") == 1
    assert second.seen == []
    out = tmp_path / "out"
    # The endpoint's error, not the items': they stay pending (the attempts keep the reason).
    assert query(out, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("pending", 30)]
    assert query(out, "SELECT DISTINCT failure_class FROM attempts") == [("redirect",)]
    assert query(out, "SELECT COUNT(*) FROM results") == [(0,)]
    assert query(out, "SELECT COUNT(*) FROM ledger") == [(0,)]
    assert query(out, "SELECT COUNT(*) FROM outstanding") == [(0,)]
    assert "30 items not sent: the run stopped: redirect: HTTP 307" in proc.stdout


async def test_an_openrouter_endpoint_that_redirects_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    async with pair(308) as (first, second):
        proc = await _in_thread(run_cli, "run", str(_job(tmp_path, first, "openrouter")))
    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"error: endpoint default: http://127.0.0.1:{first.port}/v1 cannot be reached: HTTP 308 "
        f"redirect from http://127.0.0.1:{first.port} to http://localhost:{second.port}/v1/models"
    )
    assert [(m, p) for m, p, _ in first.seen] == [("GET", "/v1/models")]
    assert second.seen == []


async def _in_thread(fn: Callable[..., object], *args: str) -> object:
    """A blocking CLI call beside the servers of this event loop."""
    import asyncio

    return await asyncio.to_thread(fn, *args)


async def test_the_management_key_never_follows_a_redirect() -> None:
    from regen.engine.client.keys import KeyApi, KeyApiError

    async with pair(307) as (first, second):
        api = KeyApi(f"http://127.0.0.1:{first.port}/api/v1", "sk-or-v1-mgmt")
        with pytest.raises(KeyApiError) as info:
            async with api:
                await api.create("job", 1.0)
    assert "HTTP 307 redirect to http://localhost:" in str(info.value)
    assert "not followed" in str(info.value)
    assert second.seen == []


@pytest.mark.parametrize("entry", ["https://eu.example.com", "eu.example.com/v1", "", "a b"])
def test_follow_redirects_to_takes_hosts_only(tmp_path: Path, entry: str) -> None:
    from regen.config import load_job
    from regen.errors import ConfigError

    job = write_job(tmp_path, "http://127.0.0.1:9/v1", datasets=[("chat", "c.jsonl", "openai")])
    add_to_section(job, "endpoint", f'follow_redirects_to = ["10.0.0.2:8000", "{entry}"]')
    with pytest.raises(ConfigError) as info:
        load_job(job)
    assert f"field 'endpoint.follow_redirects_to': {entry!r} is not a host name" in str(info.value)
