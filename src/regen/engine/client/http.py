"""The aiohttp session: the only place regen touches aiohttp on the client side."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from yarl import URL

from regen.conversation import Result
from regen.engine.client.errors import (
    ERROR_BODY_BYTES,
    answer_bound,
    brief,
    class_of_status,
    error_from_body,
    looks_like_html,
    oversized,
    parse_retry_after,
)
from regen.engine.client.redirects import (
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    RedirectPolicy,
    too_many,
)
from regen.engine.client.response import (
    loads_answer,
    parse_chat_body,
    parse_choices,
    result_from_body,
)
from regen.engine.client.sse import StreamAssembler
from regen.errors import EndpointError

REFUSABLE = {"return_token_ids": "token_ids", "return_prompt_token_ids": "token_ids"}
"""Fields regen adds that an answer can do without, by the [endpoint] setting that asks for
them: a server that refuses one (400 or 422 naming it) is sent it no more."""
UNKNOWN_FIELD = ("extra", "unknown", "unrecognized", "unexpected", "not permitted")
"""Words of a 400 that refuses a field the server does not know (a 422 says so by itself)."""
NO_HEALTH = (404, 405)
"""A `/health` answering these is not there (a proxy that routes only `/v1`)."""

SIDE_BODY_BYTES = 16 * 1024 * 1024
"""The most of an account or catalogue read's body that is read (a model's endpoint list is a
few kilobytes; OpenRouter's whole model list a few megabytes)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Limits for one attempt. `ttfb_s` and `idle_s` apply to streamed requests only: a
    non-streamed answer may send nothing at all until it is complete."""

    total_s: float = 600.0
    connect_s: float = 30.0
    ttfb_s: float = 300.0
    idle_s: float = 60.0
    read_interval_s: float = 0.0
    """Read a stream at most this often (0: every chunk as it comes). Between reads the
    connection's transport is paused, so the kernel (or the TLS layer) gathers the chunks and
    one wake-up of the event loop takes them all; a wake-up per chunk costs far more than
    parsing it. A stream then ends up to this much later."""


class ChatClient:
    """One aiohttp session for one endpoint, with a pool sized to the concurrency that uses it.
    Does not retry or schedule: every failure comes back as an EndpointError with its class."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        concurrency: int,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 30.0,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        follow_redirects_to: Sequence[str] = (),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self._redirects = RedirectPolicy.of(self.base_url, follow_redirects_to)
        """Which redirects are followed: to the base URL's origin, or to a listed host."""
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._concurrency = concurrency
        self._ssl: ssl.SSLContext | bool = ssl_context or True
        """Verified TLS: the system's CAs (SSL_CERT_FILE works), or this context."""
        self.default_timeouts = Timeouts(total_s=timeout_s, connect_s=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._side: aiohttp.ClientSession | None = None
        """A small session of its own for account and catalogue reads, so that they are never
        queued behind a pool full of chat requests."""
        self._timeouts: dict[tuple[Timeouts, bool], aiohttp.ClientTimeout] = {}
        self.chunks_received = 0
        self.stream_reads = 0
        """Reads of streamed bodies: with a read interval, far fewer than chunks."""
        self.refused: set[str] = set()
        """Fields of REFUSABLE the server refused: left out of every request from then on."""
        self.learned: list[str] = []
        """What was learned of the server and not yet said (the scheduler takes the lines)."""
        self._model: Any = None
        """The model of the last request: a probe without `/health` asks it for one token."""
        self._no_health = False

    async def __aenter__(self) -> ChatClient:
        # aiohttp's default pool caps at 100 connections: size it to the concurrency instead.
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0, ssl=self._ssl)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for session in (self._session, self._side):
            if session is not None:
                await session.close()
        self._session = self._side = None

    def _client_timeout(self, t: Timeouts, stream: bool) -> aiohttp.ClientTimeout:
        key = (t, stream)
        timeout = self._timeouts.get(key)
        if timeout is None:
            # A stream's silences are timed by the reads below, not by aiohttp's sock_read:
            # that one also times the wait for the response headers, which ttfb_s is for (a
            # stream whose headers took longer than idle_s was cut before they came).
            timeout = aiohttp.ClientTimeout(total=t.total_s, sock_connect=t.connect_s)
            self._timeouts[key] = timeout
        return timeout

    async def chat(
        self,
        item_id: str,
        body: dict[str, Any],
        *,
        stream: bool = False,
        timeouts: Timeouts | None = None,
        on_generation: Callable[[str], None] | None = None,
    ) -> Result:
        """Send one request; return its Result or raise an EndpointError with its class.
        `on_generation` is called with the generation id as soon as the response names it (its
        `X-Generation-Id` header, else a stream's first chunk), before the answer is in."""
        got = await self._chat(item_id, body, stream, timeouts, on_generation, None)
        assert isinstance(got, Result)
        return got

    async def chat_choices(
        self,
        item_ids: list[str],
        body: dict[str, Any],
        *,
        timeouts: Timeouts | None = None,
        on_generation: Callable[[str], None] | None = None,
    ) -> list[Result | EndpointError]:
        """Send one request for len(item_ids) choices (`n`, not streamed): each item's Result
        (its choice, its share of the bill) or the error of its choice. An error of the whole
        request is raised, as `chat` raises it."""
        body = {**body, "n": len(item_ids)}
        got = await self._chat(item_ids[0], body, False, timeouts, on_generation, item_ids)
        assert isinstance(got, list)
        return got

    async def _chat(
        self,
        item_id: str,
        body: dict[str, Any],
        stream: bool,
        timeouts: Timeouts | None,
        on_generation: Callable[[str], None] | None,
        items: list[str] | None,
    ) -> Result | list[Result | EndpointError]:
        # A refused field is learned and the request sent again without it at once: the
        # refusal generated nothing, so nothing is paid twice.
        while True:
            sent = body
            if self.refused:  # a copy only once a field was refused: this runs per request
                sent = {k: v for k, v in body.items() if k not in self.refused}
            self._model = sent.get("model")
            try:
                return await self._chat_once(item_id, sent, stream, timeouts, on_generation, items)
            except _Refused:
                continue

    def _learn_refusal(self, status: int, head: bytes, body: dict[str, Any]) -> bool:
        """Whether an error status refuses a field of REFUSABLE that the body carries (its
        error names it); if so, it is learned and said once."""
        text = head.decode("utf-8", "replace")
        named = [f for f in REFUSABLE if f in body and f in text]
        # Only a server that does not know the field: a refusal on a condition (SGLang's ids
        # on streams, which the job's check refuses first) is the request's, not the server's.
        unknown = status == 422 or any(w in text.lower() for w in UNKNOWN_FIELD)
        if status not in (400, 422) or not named or not unknown:
            return False
        for field_name in sorted(set(named) - self.refused):  # requests in flight learn it too
            self.refused.add(field_name)
            self.learned.append(
                f"the server at {self.base_url} refused {field_name} (HTTP {status}): regen "
                "sends it no more and goes on; its answers carry no exact token ids (set "
                f"[endpoint] {REFUSABLE[field_name]} = false to say so in the job)"
            )
        return True

    async def _chat_once(
        self,
        item_id: str,
        body: dict[str, Any],
        stream: bool,
        timeouts: Timeouts | None,
        on_generation: Callable[[str], None] | None,
        items: list[str] | None,
    ) -> Result | list[Result | EndpointError]:
        """One attempt: send the body, read its answer, and give any failure its class and
        whether it may have been billed."""
        assert self._session is not None, "use ChatClient as an async context manager"
        t = timeouts or self.default_timeouts
        if stream:
            body = {**body, "stream": True}
        # orjson's bytes keep the 4 KiB it allocated to write into, however short the body;
        # the request holds them until the answer is in, and at 10,000 in flight that came to
        # 40 MB. An exact-size copy costs a fraction of a microsecond.
        data = bytes(memoryview(orjson.dumps(body)))
        limit = answer_bound(body, len(data))
        timeout = self._client_timeout(t, stream)
        at = _Attempt(t, time.monotonic())
        try:
            resp = await self._post(self._session, at, data, timeout, stream)
            async with resp:
                at.status = resp.status
                if at.status != 200:
                    await self._raise_for_status(at.status, resp, body)
                # From here on a generation exists and may be billed, even if its body is cut.
                at.generation_id = resp.headers.get("X-Generation-Id")
                if at.generation_id and on_generation is not None:
                    on_generation(at.generation_id)
                if not stream:
                    raw = await read_answer(resp, limit, body)
                    latency = time.monotonic() - at.started
                    if items is not None:
                        return parse_choices(items, raw, latency_s=latency)
                    return parse_chat_body(item_id, raw, status=200, latency_s=latency)
                at.assembler = StreamAssembler(limit, body)
                streamed = await self._read_stream(at, at.assembler, resp, on_generation)
                return result_from_body(
                    item_id, streamed, status=200, latency_s=time.monotonic() - at.started
                )
        except EndpointError as exc:
            at.settle(exc)
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc, at) from exc

    async def _post(
        self,
        session: aiohttp.ClientSession,
        at: _Attempt,
        data: bytes,
        timeout: aiohttp.ClientTimeout,
        stream: bool,
    ) -> aiohttp.ClientResponse:
        """POST the attempt's body and wait for the response's headers."""
        t = at.limits
        request = self._send(session, "POST", self.url, data=data, timeout=timeout)
        if stream:
            # A stream's headers come at once; its first bytes only when generation
            # starts. The time-to-first-byte limit covers both.
            async with _Limit(t.ttfb_s, "timeout", f"no response within {t.ttfb_s:g} s"):
                at.resp = await request
        else:
            at.resp = await request
        return at.resp

    async def _raise_for_status(
        self, status: int, resp: aiohttp.ClientResponse, body: dict[str, Any]
    ) -> None:
        """Raise for an error status: _Refused if it refuses a field regen can leave out (the
        request is then sent again without it), else its EndpointError."""
        retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        head, _ = await read_at_most(resp.content, ERROR_BODY_BYTES)
        if self._learn_refusal(status, head, body):
            raise _Refused
        raise _http_error(status, head, retry_after)

    async def _read_stream(
        self,
        at: _Attempt,
        assembler: StreamAssembler,
        resp: aiohttp.ClientResponse,
        on_generation: Callable[[str], None] | None,
    ) -> dict[str, Any]:
        """Read a streamed answer into `assembler`, within the first-byte and idle limits, and
        return the answer it makes; the generation id is said as soon as a chunk names
        it, if the headers did not."""
        t = at.limits
        first_byte = t.ttfb_s - (time.monotonic() - at.started)
        async with _Limit(first_byte, "timeout", f"no bytes within {t.ttfb_s:g} s"):
            piece = await resp.content.readany()
        pace = min(t.read_interval_s, t.idle_s / 4)
        conn = resp.connection
        transport = conn.transport if conn is not None and pace > 0 else None
        named = at.generation_id is not None or on_generation is None
        stalled = f"no bytes for {t.idle_s:g} s"
        while piece:
            self.stream_reads += 1
            assembler.feed(piece)
            if not named and assembler.meta.get("id"):
                named = True
                gen = assembler.meta["id"]
                if isinstance(gen, str) and on_generation is not None:
                    on_generation(gen)
            async with _Limit(t.idle_s, "stalled", stalled):
                if transport is None or assembler.finish_reason is not None:
                    piece = await resp.content.readany()
                else:
                    piece = await read_later(transport, resp.content, pace)
        self.chunks_received += assembler.chunks
        return assembler.body()

    def _side_session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use ChatClient as an async context manager"
        if self._side is None:
            self._side = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2, ssl=self._ssl),
                headers=self._session.headers,
            )
        return self._side

    async def get_json(self, path: str) -> Any:
        """GET `{base_url}/{path}` and return its JSON, or None on any failure (these reads
        are informative: a run never fails because one of them did)."""
        side = self._side_session()
        url = f"{self.base_url}/{path}"
        try:
            async with await self._send(
                side, "GET", url, timeout=aiohttp.ClientTimeout(total=30)
            ) as resp:
                if resp.status != 200:
                    return None
                raw, whole = await read_at_most(resp.content, SIDE_BODY_BYTES)
                # NaN-tolerant: a bill of NaN is the gate's to refuse, not a record missing.
                return loads_answer(raw) if whole else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, EndpointError):
            return None

    async def reach(self, timeout_s: float = 15.0) -> str | None:
        """Whether the server answers at all (`GET {base_url}/models`, whatever its status):
        None if it does, else why not, in one line."""
        side = self._side_session()
        url = f"{self.base_url}/models"
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with await self._send(side, "GET", url, timeout=timeout) as resp:
                await read_at_most(resp.content, SIDE_BODY_BYTES)
                return None
        except EndpointError as exc:  # a redirect regen does not follow
            return exc.message
        except aiohttp.ClientConnectorCertificateError as exc:
            return (
                f"the TLS certificate of {exc.host} is not trusted ({exc.certificate_error}): "
                "for a server behind a private CA, point SSL_CERT_FILE at its CA bundle"
            )
        except aiohttp.ClientConnectorError as exc:
            reason = exc.strerror or type(exc.os_error).__name__
            return f"cannot connect to {exc.host}:{exc.port}: {reason}"
        except TimeoutError:
            return f"no answer from {url} within {timeout_s:g} s"
        except (aiohttp.ClientError, ValueError) as exc:
            return f"{type(exc).__name__}{_detail(exc)}"

    async def probe(self, url: str) -> bool:
        """Whether a GET of `url` (a server's /health) answers 200 within 5 s. A server with
        no `/health` there (404, 405) is asked for one token of its model instead: waiting
        for a route that does not exist would keep a serving server out."""
        side = self._side_session()
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            if not self._no_health:
                async with await self._send(side, "GET", url, timeout=timeout) as resp:
                    if resp.status not in NO_HEALTH or self._model is None:
                        return resp.status == 200
                self._no_health = True
            ask = {
                "model": self._model,
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1,
            }
            data = orjson.dumps(ask)
            async with await self._send(side, "POST", self.url, data=data, timeout=timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, EndpointError):
            return False

    async def _send(
        self, session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        """A request whose redirects regen follows itself, by its RedirectPolicy: aiohttp's
        would follow any to any host. Raises EndpointError (`redirect`) for one it refuses."""
        at = URL(url)
        for _ in range(MAX_REDIRECTS + 1):
            resp = await session.request(method, at, allow_redirects=False, **kwargs)
            if resp.status not in REDIRECT_STATUSES:
                return resp
            try:
                location = resp.headers.get("Location")
                at = self._redirects.target(method, at, resp.status, location)
            finally:
                resp.release()
        raise too_many(URL(url))


async def read_answer(resp: aiohttp.ClientResponse, limit: int, request: dict[str, Any]) -> bytes:
    """A whole answer's body, read no further than `limit` bytes (errors.answer_bound): past
    it, or when its Content-Length says it will be, it is `oversized_answer` (and the caller
    closes the connection)."""
    length = resp.content_length
    if length is not None and length > limit:
        raise oversized(limit, request)
    pieces: list[bytes] = []
    size = 0
    while piece := await resp.content.readany():
        size += len(piece)
        if size > limit:
            raise oversized(limit, request)
        pieces.append(piece)
    return b"".join(pieces)


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of a body, and whether that is all of it (the rest is not read:
    the connection closes when the response is released)."""
    pieces: list[bytes] = []
    size = 0
    while size <= limit:
        piece = await content.readany()
        if not piece:
            return b"".join(pieces), True
        pieces.append(piece)
        size += len(piece)
    return b"".join(pieces)[:limit], False


async def read_later(
    transport: asyncio.Transport, content: aiohttp.StreamReader, delay_s: float
) -> bytes:
    """The stream's next bytes, read no sooner than `delay_s` from now: the transport is
    paused until then, so whatever the server sent meanwhile comes in one read. It is
    resumed however this ends (the connection may go back to the pool)."""
    transport.pause_reading()
    handle = asyncio.get_running_loop().call_later(delay_s, transport.resume_reading)
    try:
        return await content.readany()
    finally:
        handle.cancel()
        transport.resume_reading()


class _Limit:
    """`asyncio.timeout(seconds)` that raises EndpointError(failure_class, message) when it
    runs out. Another limit running out inside it (the attempt's total, which aiohttp times)
    passes through as it is: a stream whose bytes keep coming past the total is a `timeout`,
    not `stalled`."""

    __slots__ = ("_timeout", "_class", "_message")

    def __init__(self, seconds: float, failure_class: str, message: str) -> None:
        self._timeout = asyncio.timeout(seconds)
        self._class, self._message = failure_class, message

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as own:  # raised only when this limit ran out
            raise EndpointError(self._class, self._message) from own


def _begun(
    err: EndpointError, header_id: str | None, assembler: StreamAssembler | None
) -> EndpointError:
    """A request that reached the provider and failed without an error status may have been
    billed. Say so, and which generation it was when known (the `X-Generation-Id` header,
    else a stream's first chunk), so that its cost can be looked up."""
    err.maybe_billed = True
    if err.generation_id is None:
        gen = header_id or (assembler.meta.get("id") if assembler is not None else None)
        if isinstance(gen, str) and gen:
            err.generation_id = gen
    return err


@dataclass(slots=True)
class _Attempt:
    """How far one attempt got: its failure is read against it (whether it may have been
    billed, and under which generation id)."""

    limits: Timeouts
    started: float
    status: int | None = None
    resp: aiohttp.ClientResponse | None = None
    generation_id: str | None = None
    """The `X-Generation-Id` header, once the response is in."""
    assembler: StreamAssembler | None = None

    def settle(self, exc: EndpointError) -> None:
        """Mark an EndpointError of this attempt as maybe billed when it may have been, and
        close a connection left with an answer not read to its end."""
        if exc.failure_class == "oversized_answer" and self.resp is not None:
            self.resp.close()  # the rest of the answer is not read: the connection cannot be reused
        # An error status is not billed, nor is a whole error body; silence, a body cut
        # short, a stream that broke off or an answer too big to read may be.
        if self.status in (None, 200) and not (exc.unbilled and self.assembler is None):
            _begun(exc, self.generation_id, self.assembler)


def _failure(exc: aiohttp.ClientError | TimeoutError, at: _Attempt) -> EndpointError:
    """The EndpointError of an aiohttp error or timeout in an attempt: one that never reached
    the server is not billed; any other may have been."""
    t = at.limits
    if isinstance(exc, aiohttp.SocketTimeoutError):
        err = EndpointError("stalled", f"no bytes for {t.idle_s:g} s")
        return _begun(err, at.generation_id, at.assembler)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return EndpointError("connection", f"connect timed out after {t.connect_s:g} s")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):  # retrying cannot help
        return EndpointError(
            "tls",
            f"the TLS certificate of {exc.host} is not trusted ({exc.certificate_error}): "
            "for a server behind a private CA, point SSL_CERT_FILE at its CA bundle",
        )
    if isinstance(exc, aiohttp.ClientConnectorError):  # never reached the server: not billed
        reason = exc.strerror or type(exc.os_error).__name__
        return EndpointError(
            "connection",
            f"cannot connect to {exc.host}:{exc.port}: {reason} (is the server running, "
            "and is [endpoint].base_url right?)",
        )
    if isinstance(exc, TimeoutError):
        err = EndpointError("timeout", f"request took over {t.total_s:g} s")
    else:
        err = EndpointError("connection", type(exc).__name__ + _detail(exc))
    return _begun(err, at.generation_id, at.assembler)


def _detail(exc: BaseException) -> str:
    text = str(exc)
    return f": {text[:200]}" if text else ""


class _Refused(Exception):
    """A request refused for a field of REFUSABLE, now learned: it is sent again without."""


def _http_error(status: int, raw: bytes, retry_after: float | None) -> EndpointError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        # The HTTP status wins over a `code` in the body that disagrees with it.
        error = {**body["error"], "code": status}
        return error_from_body(error, status=status, retry_after_s=retry_after)
    if isinstance(body, dict) and body.get("object") == "error" and "message" in body:
        # SGLang's (and older vLLM's) flat error: the fields at the top level.
        error = {**body, "code": status}
        return error_from_body(error, status=status, retry_after_s=retry_after)
    text = brief(raw[:200].decode("utf-8", "replace").strip(), 200) or "no body"
    if looks_like_html(raw):
        text = (
            "an HTML page, not an API error (a web server or proxy answered: is "
            "[endpoint].base_url the API's, ending in /api/v1 or /v1?)"
        )
    return EndpointError(
        class_of_status(status, text),
        f"HTTP {status}: {text}",
        status=status,
        retry_after_s=retry_after,
    )
