"""Nothing a server sends escapes, leaks, crashes or exhausts regen: an answer bigger than its
max_tokens can make is cut off, classed `oversized_answer`, never stored, and its bill still
reaches the ledger; text that cannot be stored as text is kept with U+FFFD, once, billed and
flagged by the audit; and no hostile shape of body or stream gets past the parsers as anything
but a result or regen's own EndpointError."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from regen.conversation import Result
from regen.engine.client import ChatClient
from regen.engine.client import errors as client_errors
from regen.engine.client.errors import FAILURE_CLASSES, parse_retry_after
from regen.engine.client.response import parse_chat_body, result_from_body
from regen.engine.client.sse import StreamAssembler
from regen.errors import EndpointError
from regen.outputs import audit
from regen.reconstruct import ReconstructError
from regen.sim import SimConfig, sim_in_thread
from regen.state.answers import ExportRow
from tests.conftest import fuzz_examples, query, run_cli, write_job
from tests.engine.test_scheduler import make_job, rows, run
from tests.scripted_server import Reply, scripted_server

HOSTILE_BYTES = 30 * 1024 * 1024
"""What the hostile server sends for an answer of max_tokens 50 (billed as 3 tokens)."""
PIECE = b"x" * 65536
REQUEST = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
USAGE = b'"usage":{"prompt_tokens":5,"completion_tokens":3,"cost":0.001}'
WHOLE_HEAD = (
    b'{"id":"gen-big","provider":"Hostile","choices":[{"index":0,"finish_reason":"stop",'
    b'"message":{"role":"assistant","content":"'
)
WHOLE_TAIL = b'"}}],' + USAGE + b"}"


@dataclass
class Served:
    """What the hostile server managed to send of one answer."""

    sent: int = 0
    whole: bool = False
    """It sent all of it: the client read to the end."""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def ended(self) -> None:
        """Wait (with a deadline) until the server's handler has ended."""
        await asyncio.wait_for(self.done.wait(), 30)


Handler = Callable[[web.Request, Served], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def hostile(handler: Handler) -> AsyncIterator[tuple[str, Served]]:
    """A server on 127.0.0.1 that answers every chat request with `handler`."""
    served = Served()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        try:
            return await handler(request, served)
        finally:
            served.done.set()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", served
    finally:
        await runner.cleanup()


async def send_in_pieces(
    resp: web.StreamResponse, served: Served, head: bytes, piece: bytes, tail: bytes
) -> web.StreamResponse:
    """Write head, pieces up to HOSTILE_BYTES, and tail, until the client goes away."""
    try:
        await resp.write(head)
        while served.sent < HOSTILE_BYTES:
            await resp.write(piece)
            served.sent += len(piece)
        await resp.write(tail)
        await resp.write_eof()
        served.whole = True
    except ConnectionError:
        pass
    return resp


async def whole_answer(request: web.Request, served: Served) -> web.StreamResponse:
    """A non-streamed answer of 30 MB, chunked (no Content-Length to refuse it by)."""
    resp = web.StreamResponse(
        headers={"Content-Type": "application/json", "X-Generation-Id": "gen-big"}
    )
    await resp.prepare(request)
    return await send_in_pieces(resp, served, WHOLE_HEAD, PIECE, WHOLE_TAIL)


async def stream_answer(request: web.Request, served: Served) -> web.StreamResponse:
    """A stream of 30 MB in chunks of 64 KiB of content each; its id only in its chunks."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = (
        b'data: {"id":"gen-stream","choices":[{"index":0,"delta":{"content":"'
        + PIECE
        + b'"}}]}\n\n'
    )
    return await send_in_pieces(resp, served, b": OPENROUTER PROCESSING\n\n", chunk, b"")


async def one_line_stream(request: web.Request, served: Served) -> web.StreamResponse:
    """A stream whose first event never ends: 30 MB without a newline."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    head = b'data: {"id":"gen-line","choices":[{"index":0,"delta":{"content":"'
    return await send_in_pieces(resp, served, head, PIECE, b'"}}]}\n\n')


def answer(content: bytes = b"fine", usage: bytes = USAGE) -> bytes:
    return (
        b'{"id":"gen-1","provider":"P","choices":[{"index":0,"finish_reason":"stop",'
        b'"message":{"role":"assistant","content":"' + content + b'"}}],' + usage + b"}"
    )


async def chat(url: str, *, stream: bool = False, body: dict[str, Any] = REQUEST) -> Result:
    async with ChatClient(url, "k", concurrency=2) as c:
        return await c.chat("i", body, stream=stream)


async def failure(url: str, *, stream: bool = False) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        await chat(url, stream=stream)
    return info.value


# --- 1. An answer larger than its max_tokens can make -------------------------------------


def test_the_bound_follows_max_tokens_and_the_prompt_ids_asked_for() -> None:
    bound = client_errors.answer_bound
    assert bound(REQUEST, 100) < 1024 * 1024 < HOSTILE_BYTES  # 50 tokens: about 460 KB
    assert bound({"max_tokens": 8192}, 100) > 8192 * 2048  # room for streamed, escaped text
    ids = {**REQUEST, "return_token_ids": True}
    assert bound(ids, 100_000) - bound(REQUEST, 100_000) >= 11 * 100_000  # the prompt's ids
    logprobs = {**REQUEST, "logprobs": True, "top_logprobs": 20}
    assert bound(logprobs, 100) > bound(REQUEST, 100) + 50 * 20 * 100


async def test_a_whole_answer_past_its_bound_is_oversized_and_read_no_further() -> None:
    """A server answered 30 MB for max_tokens 50: it was stored and exported, and 8 such at
    once took regen to 1.27 GB."""
    async with hostile(whole_answer) as (url, served):
        exc = await failure(url)
        await served.ended()
    assert exc.failure_class == "oversized_answer"
    assert "max_tokens = 50" in exc.message and "\n" not in exc.message
    # It reached the provider and may be billed: its bill is looked up by its generation id.
    assert exc.maybe_billed and exc.generation_id == "gen-big"
    assert not served.whole and served.sent < HOSTILE_BYTES / 2  # the connection was closed


async def test_a_content_length_past_the_bound_is_refused_before_reading() -> None:
    async def declared(request: web.Request, served: Served) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(WHOLE_HEAD) + HOSTILE_BYTES + len(WHOLE_TAIL)
        await resp.prepare(request)
        return await send_in_pieces(resp, served, WHOLE_HEAD, PIECE, WHOLE_TAIL)

    async with hostile(declared) as (url, served):
        assert (await failure(url)).failure_class == "oversized_answer"
        await served.ended()
    assert not served.whole


async def test_a_compressed_answer_is_bounded_by_what_it_inflates_to() -> None:
    """30 MB gzipped to 30 KB: aiohttp inflates it; the bound counts the inflated bytes."""
    packed = gzip.compress(WHOLE_HEAD + b"x" * HOSTILE_BYTES + WHOLE_TAIL, 9)

    async def bomb(request: web.Request, served: Served) -> web.StreamResponse:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        return web.Response(body=packed, headers=headers)

    async with hostile(bomb) as (url, _):
        assert (await failure(url)).failure_class == "oversized_answer"


@pytest.mark.parametrize("handler", [stream_answer, one_line_stream])
async def test_a_stream_past_its_bound_is_oversized_and_read_no_further(
    handler: Handler,
) -> None:
    async with hostile(handler) as (url, served):
        exc = await failure(url, stream=True)
        await served.ended()
    assert exc.failure_class == "oversized_answer" and exc.maybe_billed
    if handler is stream_answer:  # named by its first chunk
        assert exc.generation_id == "gen-stream"
    assert not served.whole and served.sent < HOSTILE_BYTES / 2


async def test_an_answer_within_its_bound_is_kept_however_it_is_escaped() -> None:
    """The bound is generous: 50 tokens of 128 control characters each, each written as a
    six-byte escape, is still an answer."""
    content = "\x01" * (50 * 128)

    async def escaped(request: web.Request, served: Served) -> web.StreamResponse:
        return web.Response(body=answer(json.dumps(content)[1:-1].encode()))

    async with hostile(escaped) as (url, _):
        assert (await chat(url)).message.content == content


async def test_an_error_status_body_is_read_only_as_far_as_its_message() -> None:
    async def huge_error(request: web.Request, served: Served) -> web.StreamResponse:
        resp = web.StreamResponse(status=502, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        return await send_in_pieces(resp, served, b"bad gateway \x1b[2J\r\n", PIECE, b"")

    async with hostile(huge_error) as (url, served):
        exc = await failure(url)
        await served.ended()
    assert exc.failure_class == "server" and exc.message.startswith("HTTP 502: bad gateway")
    assert len(exc.message) < 300 and not served.whole
    # One line, and nothing a terminal would act on (it is printed by status and the view).
    assert not any(c in exc.message for c in "\x1b\r\n")


def test_retry_after_cannot_hold_an_item_for_ever() -> None:
    cap = client_errors.RETRY_AFTER_MAX_S
    assert parse_retry_after("1e9") == cap and parse_retry_after("inf") == cap
    assert parse_retry_after("nan") is None and parse_retry_after("-5") == 0.0
    body = {"error": {"code": 429, "message": "slow", "availability": {"retry_after": 1e300}}}
    exc = fails(json.dumps(body).encode())
    assert exc.failure_class == "rate_limited" and exc.retry_after_s == cap


class HostileProxy:
    """OpenRouter's API through the simulator, except that every chat answer is 30 MB: the
    simulator generates, bills and records each one (its `/generation` has the bill), and
    the client gets the simulator's generation id with a body far past max_tokens."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removesuffix("/api/v1")
        self.session: aiohttp.ClientSession | None = None
        self.answered = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/chat/completions", self.chat)
        app.router.add_get("/{tail:.*}", self.forward)
        return app

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        return self.session

    async def forward(self, request: web.Request) -> web.Response:
        headers = {"Authorization": request.headers.get("Authorization", "")}
        async with self._session().get(self.upstream + request.path_qs, headers=headers) as up:
            return web.Response(
                status=up.status,
                body=await up.read(),
                headers={"Content-Type": up.headers.get("Content-Type", "application/json")},
            )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        headers = {"Authorization": request.headers.get("Authorization", "")}
        url = self.upstream + "/api/v1/chat/completions"
        async with self._session().post(url, data=await request.read(), headers=headers) as up:
            real = json.loads(await up.read())
        self.answered += 1
        resp = web.StreamResponse(
            headers={"Content-Type": "application/json", "X-Generation-Id": real["id"]}
        )
        await resp.prepare(request)
        return await send_in_pieces(resp, Served(), WHOLE_HEAD, PIECE, WHOLE_TAIL)


@contextmanager
def serve_in_thread(make_app: Callable[[], web.Application]) -> Iterator[str]:
    """Serve an app on 127.0.0.1 from a thread of its own (`regen run` runs its own loop):
    its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    where: list[str] = []

    async def start() -> web.AppRunner:
        runner = web.AppRunner(make_app(), access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        where.append(f"http://127.0.0.1:{runner.addresses[0][1]}/api/v1")
        return runner

    def serve() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield where[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def test_oversized_answers_are_retried_never_stored_and_their_bills_reach_the_ledger(
    tmp_path: Path,
) -> None:
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0, generation_delay_s=0.0)) as sim:
        proxy = HostileProxy(sim.base_url)

        def app() -> web.Application:
            application = proxy.app()

            async def close(_: web.Application) -> None:
                if proxy.session is not None:
                    await proxy.session.close()

            application.on_cleanup.append(close)
            return application

        with serve_in_thread(app) as url:
            job = write_job(
                tmp_path,
                url,
                rows=3,
                extra="max_attempts = 2\nstop_error_rate = 1.0",
            )
            res = run_cli("run", str(job))
        billed = sim.simulator.billed_usd()
    assert res.returncode == 3, res.stdout + res.stderr
    out = tmp_path / "out"
    assert query(out, "SELECT status, failure_class, COUNT(*) FROM items GROUP BY 1, 2") == [
        ("failed", "oversized_answer", 3)
    ]
    assert query(out, "SELECT failure_class, COUNT(*) FROM attempts GROUP BY 1") == [
        ("oversized_answer", 6)
    ]
    assert query(out, "SELECT COUNT(*) FROM results") == [(0,)]
    assert proxy.answered == 6 and billed > 0
    # Each attempt was billed by the provider, and each bill is in the ledger.
    ((kind, n, usd),) = query(out, "SELECT kind, COUNT(*), SUM(cost_usd) FROM ledger GROUP BY 1")
    assert (kind, n) == ("failed_attempt", 6) and math.isclose(usd, billed, rel_tol=1e-9)


# --- 2. Text that cannot be stored as text ------------------------------------------------


def parse(raw: bytes) -> Result:
    return parse_chat_body("item", raw, status=200, latency_s=0.1)


def fails(raw: bytes) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        parse(raw)
    return info.value


def test_a_lone_surrogate_is_kept_as_u_fffd_not_refused() -> None:
    r = parse(answer(rb"abc\ud800def"))
    assert r.message.content == "abc\ufffddef" and r.usage.completion_tokens == 3
    r.message.content.encode("utf-8")  # storable: SQLite takes UTF-8
    # A pair is a character; an escaped backslash before "ud800" is text, not an escape.
    pair = parse(answer(rb"\ud83d\ude00 \\ud800 \udc00\ud800\ud83d\ude00"))
    assert pair.message.content == "\U0001f600 \\ud800 \ufffd\ufffd\U0001f600"


def test_bytes_that_are_not_utf8_are_kept_as_u_fffd() -> None:
    r = parse(answer(b"caf\xe9 \xed\xa0\x80!"))
    assert r.message.content.startswith("caf\ufffd ") and r.message.content.endswith("!")
    assert "\ufffd" in r.message.content[5:]


def test_a_streamed_lone_surrogate_is_kept_as_u_fffd() -> None:
    a = StreamAssembler()
    a.feed(b'data: {"id":"g","choices":[{"index":0,"delta":{"content":"ab\\udfff"}}]}\n\n')
    a.feed(b'data: {"choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}\n')
    a.feed(b"\ndata: [DONE]\n\n")
    r = result_from_body("i", a.body(), status=200, latency_s=0.1)
    assert r.message.content == "ab\ufffdc"


async def test_an_answer_with_a_lone_surrogate_is_stored_once_and_billed(
    tmp_path: Path,
) -> None:
    """It was classed invalid and retried until the item failed; each attempt was billed,
    and none reached the ledger."""
    job, store = make_job(tmp_path, 1)
    raw = answer(rb"abc\ud800def").decode()
    async with scripted_server(lambda n, _: Reply(body=raw)) as srv:
        await run(job, store, srv.url)
    assert len(srv.requests) == 1  # not retried
    assert rows(store, "SELECT status, attempts FROM items") == [("done", 1)]
    assert rows(store, "SELECT content FROM results") == [("abc\ufffddef",)]
    assert rows(store, "SELECT kind, cost_usd FROM ledger") == [("completion", 0.001)]


# --- 3. The audit: text far longer than its bill, and text that lost a character ----------


def row(content: str, completion_tokens: int, **kw: Any) -> ExportRow:
    conversation = {"messages": [{"role": "user", "content": "q"}]}
    return ExportRow(
        "item",
        1,
        conversation,
        content,
        None,
        [],
        "stop",
        completion_tokens=completion_tokens,
        **kw,
    )


def test_the_audit_flags_text_far_longer_than_its_bill() -> None:
    assert audit.text_problems(row("x" * 30_000_000, 3)) == ["text_long_for_bill"]
    n = audit.TEXT_BYTES_PER_BILLED_TOKEN
    assert audit.text_problems(row("x" * n * 10, 10)) == []  # at most 128 bytes a token
    assert audit.text_problems(row("x" * (n * 10 + 1), 10)) == ["text_long_for_bill"]
    calls = [{"function": {"name": "f", "arguments": "y" * 5000}}]
    long_call = ExportRow("i", 1, {"messages": []}, "", "r", calls, "tool_calls")
    assert audit.text_problems(long_call) == ["text_long_for_bill"]  # 0 billed counts as 1
    # A count estimated from the text itself says nothing of the text.
    assert audit.text_problems(row("x" * 30_000, 3, usage_source="estimate")) == []


def test_the_audit_flags_text_that_holds_u_fffd_even_without_a_rebuild() -> None:
    assert audit.text_problems(row("abc\ufffddef", 3)) == ["replacement_character"]
    verdict = audit.sample_problems(
        row("abc\ufffddef", 3),
        ReconstructError("item: cannot be rebuilt"),
        None,  # type: ignore[arg-type]  # not used for an answer that could not be rebuilt
        audit.Checks(),
    )
    assert verdict.problems == ["reconstruct_error", "replacement_character"]


# --- 5. No hostile shape escapes the parsers ----------------------------------------------

TEMPLATE: dict[str, Any] = {
    "id": "gen-1",
    "provider": "P",
    "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "token_ids": [4, 5],
            "message": {
                "role": "assistant",
                "content": "text",
                "reasoning": "why",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "cost": 0.001,
        "completion_tokens_details": {"reasoning_tokens": 1},
    },
}
PATHS: list[tuple[Any, ...]] = [
    (),
    ("id",),
    ("provider",),
    ("prompt_token_ids",),
    ("choices",),
    ("choices", 0),
    ("choices", 0, "finish_reason"),
    ("choices", 0, "token_ids"),
    ("choices", 0, "error"),
    ("choices", 0, "message"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "reasoning"),
    ("choices", 0, "message", "reasoning_content"),
    ("choices", 0, "message", "tool_calls"),
    ("choices", 0, "message", "tool_calls", 0),
    ("choices", 0, "message", "tool_calls", 0, "id"),
    ("choices", 0, "message", "tool_calls", 0, "function"),
    ("choices", 0, "message", "tool_calls", 0, "function", "name"),
    ("choices", 0, "message", "tool_calls", 0, "function", "arguments"),
    ("usage",),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
    ("usage", "cost"),
    ("usage", "completion_tokens_details"),
    ("error",),
    ("error", "message"),
    ("error", "code"),
    ("error", "availability"),
    ("error", "availability", "retry_after"),
]
DEEP = "\x00deep\x00"
"""Stands in for a deeply nested value, written into the JSON text after json.dumps (which
cannot write one that deep)."""

any_text = st.text(st.characters(exclude_categories=()), max_size=12)  # controls, surrogates
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # NaN and infinities too: not JSON, as a broken server writes them
    | any_text
    | st.builds(lambda n, c: c * n, st.integers(0, 300_000), st.sampled_from("x\x00\ufffd"))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=12,
)
hostile_values = values | st.just(DEEP)


def with_value(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`doc` with the value at `path` replaced (intermediate dicts made where missing)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        if not isinstance(doc, list) or not doc:
            return doc
        return [with_value(doc[0], rest, value), *doc[1:]]
    base = dict(doc) if isinstance(doc, dict) else {}
    base[key] = with_value(base.get(key, {}), rest, value)
    return base


def dumps(doc: Any, depth: int) -> bytes:
    text = json.dumps(doc).encode()  # lone surrogates become \udXXX escapes
    deep = b"[" * depth + b'{"a":' * 2 + b"1" + b"}" * 2 + b"]" * depth
    return text.replace(json.dumps(DEEP).encode(), deep)


BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\u"]
"""Bytes that are not UTF-8 (a stray byte, half a character, an encoded surrogate), a NUL,
and half an escape."""
mangles = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(BAD_BYTES)), max_size=2)
cuts = st.none() | st.floats(0, 1)
depths = st.sampled_from([2, 500, 900, 1000, 1020, 1030, 1500]) | st.integers(1, 1500)
"""How deep DEEP nests: repr() gives up near 1000, orjson refuses past 1024."""


def mangled(raw: bytes, mangle: list[tuple[float, bytes]], cut: float | None) -> bytes:
    """`raw` with bad bytes put in (at fractions of its length), then cut short."""
    for at, bad in mangle:
        i = int(at * len(raw))
        raw = raw[:i] + bad + raw[i:]
    return raw if cut is None else raw[: int(cut * len(raw))]


def storable(r: Result) -> None:
    """What the store and the ledger take from a Result is text and numbers they can hold."""
    m = r.message
    texts = [m.content, m.reasoning or "", r.finish_reason or "", r.provider or ""]
    texts += [r.model or "", r.generation_id or ""]
    for c in m.tool_calls:
        texts += [c.id, c.name, c.arguments]
    for t in texts:
        t.encode("utf-8")  # no lone surrogate: SQLite would refuse it
    u = r.usage
    for n in (u.prompt_tokens, u.completion_tokens, u.reasoning_tokens):
        assert 0 <= n <= 2**32
    assert u.cost_usd is None or (math.isfinite(u.cost_usd) and u.cost_usd >= 0)
    for ids in (r.prompt_token_ids or (), r.completion_token_ids or ()):
        assert all(0 <= t < 2**32 for t in ids)


def result_or_own_error(parse_it: Callable[[], Result]) -> None:
    try:
        r = parse_it()
    except EndpointError as exc:
        assert exc.failure_class in FAILURE_CLASSES
        assert "\n" not in exc.message and len(exc.message) < 1000
        assert exc.status is None or 200 <= exc.status <= 599  # stored as an attempt's status
        wait = exc.retry_after_s
        assert wait is None or 0 <= wait <= client_errors.RETRY_AFTER_MAX_S
        return
    storable(r)


HOSTILE = settings(
    max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


ERROR_MESSAGE = ("error", "message")
ARGUMENTS = ("choices", 0, "message", "tool_calls", 0, "function", "arguments")


@HOSTILE
@given(
    path=st.sampled_from(PATHS),
    value=hostile_values,
    depth=depths,
    mangle=mangles,
    cut=cuts,
)
@example(path=ERROR_MESSAGE, value=DEEP, depth=1000, mangle=[], cut=None)
@example(path=ERROR_MESSAGE, value="one\ntwo \x1b]0;title\x07", depth=1, mangle=[], cut=None)
@example(path=("error",), value=DEEP, depth=1000, mangle=[], cut=None)
@example(path=ARGUMENTS, value=DEEP, depth=1000, mangle=[], cut=None)
@example(path=ARGUMENTS[:-2] + ("id",), value=DEEP, depth=1000, mangle=[], cut=None)
@example(path=("usage", "cost"), value=-5.0, depth=1, mangle=[], cut=None)
@example(path=("error", "code"), value=1e30, depth=1, mangle=[], cut=None)
@example(path=("usage", "completion_tokens"), value=2**64 - 1, depth=1, mangle=[], cut=None)
@example(path=("usage", "prompt_tokens"), value=1e300, depth=1, mangle=[], cut=None)
@example(path=("prompt_token_ids",), value=[2**40], depth=1, mangle=[], cut=None)
@example(path=("choices", 0, "message", "content"), value="a\ud800", depth=1, mangle=[], cut=None)
@example(path=("id",), value="g\udfff", depth=1, mangle=[], cut=None)
@example(
    path=("choices", 0, "finish_reason"), value="x", depth=1, mangle=[(0.5, b"\xff")], cut=None
)
def test_any_hostile_body_gives_a_result_or_an_endpoint_error(
    path: tuple[Any, ...],
    value: Any,
    depth: int,
    mangle: list[tuple[float, bytes]],
    cut: float | None,
) -> None:
    raw = mangled(dumps(with_value(TEMPLATE, path, value), depth), mangle, cut)
    result_or_own_error(lambda: parse(raw))


STREAM: list[dict[str, Any]] = [
    {"id": "gen-s", "provider": "P", "model": "m", "prompt_token_ids": [1, 2]},
    {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": "why"}}]},
    {"choices": [{"index": 0, "delta": {"content": "text"}, "token_ids": [3]}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}
                    ]
                },
            }
        ]
    },
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "cost": 0.001}},
]
STREAM_PATHS: list[tuple[Any, ...]] = [
    (),
    ("id",),
    ("error",),
    ("error", "message"),
    ("usage",),
    ("prompt_token_ids",),
    ("choices",),
    ("choices", 0),
    ("choices", 0, "error"),
    ("choices", 0, "finish_reason"),
    ("choices", 0, "token_ids"),
    ("choices", 0, "delta"),
    ("choices", 0, "delta", "content"),
    ("choices", 0, "delta", "reasoning"),
    ("choices", 0, "delta", "tool_calls"),
    ("choices", 0, "delta", "tool_calls", 0),
    ("choices", 0, "delta", "tool_calls", 0, "index"),
    ("choices", 0, "delta", "tool_calls", 0, "id"),
    ("choices", 0, "delta", "tool_calls", 0, "function"),
    ("choices", 0, "delta", "tool_calls", 0, "function", "name"),
    ("choices", 0, "delta", "tool_calls", 0, "function", "arguments"),
]


CALL = ("choices", 0, "delta", "tool_calls", 0)


def stream_case(**kw: Any) -> Any:
    """An explicit case of the stream property: the first tool-call chunk changed."""
    fields = {"which": 3, "depth": 1, "done": True, "limit": None, "mangle": [], "cut": None}
    return example(**{**fields, "splits": [], **kw})


@HOSTILE
@given(
    which=st.integers(0, len(STREAM) - 1),
    path=st.sampled_from(STREAM_PATHS),
    value=hostile_values,
    depth=depths,
    done=st.booleans(),
    limit=st.none() | st.integers(0, 4096),
    mangle=mangles,
    cut=cuts,
    splits=st.lists(st.floats(0, 1), max_size=6),
)
@stream_case(path=CALL + ("index",), value=[1])
@stream_case(path=CALL + ("index",), value="1")
@stream_case(path=CALL[:-1], value=5)
@stream_case(path=("error", "message"), value=DEEP, depth=1000)
@stream_case(path=("choices", 0, "delta", "content"), value="\udbff", which=2)
@stream_case(path=("choices", 0, "finish_reason"), value={"x": 1}, which=5, done=False)
def test_any_hostile_stream_gives_a_result_or_an_endpoint_error(
    which: int,
    path: tuple[Any, ...],
    value: Any,
    depth: int,
    done: bool,
    limit: int | None,
    mangle: list[tuple[float, bytes]],
    cut: float | None,
    splits: list[float],
) -> None:
    chunks = list(STREAM)
    chunks[which] = with_value(chunks[which], path, value)
    text = b": OPENROUTER PROCESSING\n\n" + b"".join(
        b"data: " + dumps(c, depth) + b"\n\n" for c in chunks
    )
    raw = mangled(text + (b"data: [DONE]\n\n" if done else b""), mangle, cut)
    at = sorted(int(f * len(raw)) for f in splits)
    pieces = [raw[a:b] for a, b in zip([0, *at], [*at, len(raw)], strict=True)]

    def assemble() -> Result:
        a = StreamAssembler(limit, REQUEST)
        for piece in pieces:
            a.feed(piece)
        return result_from_body("i", a.body(), status=200, latency_s=0.1)

    result_or_own_error(assemble)
