"""A provider that lies about numbers: an aiohttp reverse proxy on 127.0.0.1 in front of the
simulator (OpenRouter dialect) that forwards every request and response as it is (status,
headers, bodies, SSE events as they come) but for the numbers it is told to rewrite.

A lie is (channel, field, value, share): on a share of the channel's records (drawn from the
seed and each record's name, so a record read twice says the same twice), the field is given
the value, or removed. Channels and their records:

- `catalogue`: each endpoint's `pricing` in `/models/{id}/endpoints`, each model's in `/models`
  (fields `prompt`, `completion`);
- `chat`: a chat answer's `usage`, in a JSON body or a stream's usage chunk (`prompt_tokens`,
  `completion_tokens`, `cost`);
- `generation`: a `/generation` record (`total_cost`, `tokens_prompt`, `tokens_completion`,
  `native_tokens_prompt`, `native_tokens_completion`, `native_tokens_reasoning`);
- `key`: `/key` (`usage`, `limit_remaining`); `credits`: `/credits` (`total_credits`,
  `total_usage`);
- `keys`: the key management API's key records (`/keys`, `/keys/{hash}`, made, read, listed
  or changed: `usage`, `limit`, `limit_remaining`), which a job with a management key reads.

NaN and the infinities are written as Python's json writes them (`NaN`, `Infinity`), as real
proxies do; the hostile set has them as strings too. What was rewritten is kept in `log`."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web


class _Removed:
    """The lie that leaves a field out."""

    def __repr__(self) -> str:
        return "REMOVED"


REMOVED = _Removed()

HOSTILE: tuple[Any, ...] = (
    -5,
    1e18,
    math.nan,
    -1,
    0,
    math.inf,
    -math.inf,
    "-1",
    "NaN",
    "Infinity",
    "free",
    None,
    REMOVED,
)
"""Values a lying provider gives: negative, zero, not finite, absurdly large, numbers as
strings, a word, null, and the field left out."""

FIELDS: dict[str, tuple[str, ...]] = {
    "generation": (
        "total_cost",
        "tokens_completion",
        "tokens_prompt",
        "native_tokens_prompt",
        "native_tokens_completion",
        "native_tokens_reasoning",
    ),
    "chat": ("completion_tokens", "cost", "prompt_tokens"),
    "catalogue": ("completion", "prompt"),
    "key": ("usage", "limit_remaining"),
    "credits": ("total_credits", "total_usage"),
    "keys": ("usage", "limit", "limit_remaining"),
}
CHANNELS = tuple(FIELDS)

_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


@dataclass(frozen=True)
class Lie:
    """On `share` of the channel's records, `field` says `value` (REMOVED: is left out).
    `where`, when set, limits the lie to records whose provider (an endpoint's tag or name,
    an answer's or a generation's provider) or model id contains it."""

    channel: str
    field: str
    value: Any
    share: float = 1.0
    where: str | None = None

    def __post_init__(self) -> None:
        if self.field not in FIELDS.get(self.channel, ()):
            raise ValueError(f"{self.channel} has no field {self.field!r}")

    def __str__(self) -> str:
        where = f" where {self.where}" if self.where else ""
        return f"{self.channel}.{self.field}={self.value!r}@{self.share:g}{where}"


@dataclass(frozen=True)
class Rewrite:
    """One field rewritten: where, what it said, what the proxy made it say."""

    channel: str
    path: str
    field: str
    before: Any
    after: Any


@dataclass
class LyingProxy:
    """The proxy's state: its upstream, its lies (change them between runs) and its log."""

    upstream: str
    """The simulator's origin, `http://127.0.0.1:PORT`."""
    lies: list[Lie] = field(default_factory=list)
    seed: int = 0
    log: list[Rewrite] = field(default_factory=list)
    port: int = 0
    _reads: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _session: aiohttp.ClientSession | None = field(init=False, default=None)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def told(self, channel: str | None = None) -> list[Rewrite]:
        """The rewrites made so far (of one channel)."""
        return [r for r in list(self.log) if channel is None or r.channel == channel]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
            )
        return self._session

    async def forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | {"host"}}
        body = await request.read()
        async with self._client().request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as up:
            resp = web.StreamResponse(
                status=up.status,
                reason=up.reason,
                headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP},
            )
            channel = _channel(request.method, request.path)
            lies = [lie for lie in self.lies if lie.channel == channel]
            try:
                if not lies or up.status != 200:
                    await _copy(request, resp, up)
                elif "text/event-stream" in up.headers.get("Content-Type", ""):
                    await _copy_events(request, resp, up, lambda d: self._lie(d, lies, request))
                else:
                    await _copy_json(request, resp, up, lambda d: self._lie(d, lies, request))
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                # The upstream cut the answer: cut ours too, as a proxy in between would.
                if request.transport is not None:
                    request.transport.abort()
            except ConnectionResetError:
                pass  # the client went away; the upstream's generation goes on regardless
            return resp

    def _chosen(self, lie: Lie, record: str) -> bool:
        """Whether a record is among the lie's share: drawn from the seed, the lie and the
        record's name, so that a generation read again says the same, whatever the order of
        requests."""
        digest = hashlib.blake2b(f"{self.seed}|{lie}|{record}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < lie.share * 2**64

    def _lie(self, doc: Any, lies: list[Lie], request: web.Request) -> bool:
        """Rewrite the lies' fields in every record of `doc`; True when one was rewritten."""
        changed = False
        read = next(self._reads)
        for record, who, name in _records(lies[0].channel, doc):
            for lie in lies:
                if lie.where is not None and lie.where not in who:
                    continue
                if not self._chosen(lie, name or f"read {read}"):
                    continue
                before = record.get(lie.field, REMOVED)
                if lie.value is REMOVED:
                    record.pop(lie.field, None)
                else:
                    record[lie.field] = lie.value
                self.log.append(Rewrite(lie.channel, request.path, lie.field, before, lie.value))
                changed = True
        return changed


_ACCOUNT = {"/api/v1/generation": "generation", "/api/v1/key": "key", "/api/v1/credits": "credits"}


def _channel(method: str, path: str) -> str | None:
    """Which channel a request reads: None for those the proxy never rewrites."""
    if path.startswith("/api/v1/keys"):
        return "keys"
    if method == "POST":
        return "chat" if path.endswith("/chat/completions") else None
    if path.endswith(("/endpoints", "/models")):
        return "catalogue"
    return _ACCOUNT.get(path)


def _records(channel: str, doc: Any) -> Iterator[tuple[dict[str, Any], str, str]]:
    """The dicts a channel's fields live in, each with the text `Lie.where` matches and the
    record's name (a generation's id, an endpoint's tag, a key's hash; "" for /key and
    /credits, whose every read is a record of its own)."""
    if not isinstance(doc, dict):
        return
    data = doc.get("data")
    if channel == "chat":
        if isinstance(doc.get("usage"), dict):
            yield doc["usage"], str(doc.get("provider", "")), str(doc.get("id", ""))
    elif channel == "catalogue":
        if isinstance(data, dict) and isinstance(data.get("endpoints"), list):
            for ep in data["endpoints"]:
                if isinstance(ep, dict) and isinstance(ep.get("pricing"), dict):
                    who = f"{ep.get('tag')} {ep.get('provider_name')}"
                    yield ep["pricing"], who, who
        elif isinstance(data, list):
            for model in data:
                if isinstance(model, dict) and isinstance(model.get("pricing"), dict):
                    yield model["pricing"], str(model.get("id", "")), str(model.get("id"))
    elif channel == "keys":
        for key in data if isinstance(data, list) else [data]:
            if isinstance(key, dict):
                yield key, str(key.get("name", "")), str(key.get("hash", ""))
    elif isinstance(data, dict):
        name = str(data.get("id", "")) if channel == "generation" else ""
        yield data, str(data.get("provider_name", "")), name


async def _copy(request: web.Request, resp: web.StreamResponse, up: aiohttp.ClientResponse) -> None:
    """Bytes as they come."""
    await resp.prepare(request)
    async for chunk in up.content.iter_any():
        await resp.write(chunk)
    await resp.write_eof()


async def _copy_json(
    request: web.Request,
    resp: web.StreamResponse,
    up: aiohttp.ClientResponse,
    lie: Callable[[Any], bool],
) -> None:
    """Status and headers at once, leading whitespace (OpenRouter's padding) as it comes, the
    JSON body whole once it has ended, rewritten."""
    await resp.prepare(request)
    body = b""
    async for chunk in up.content.iter_any():
        if not body:
            stripped = chunk.lstrip()
            if chunk[: len(chunk) - len(stripped)]:
                await resp.write(chunk[: len(chunk) - len(stripped)])
            chunk = stripped
        body += chunk
    await resp.write_eof(_rewritten(body, lie))


def _rewritten(raw: bytes, lie: Callable[[Any], bool]) -> bytes:
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(doc).encode() if lie(doc) else raw


async def _copy_events(
    request: web.Request,
    resp: web.StreamResponse,
    up: aiohttp.ClientResponse,
    lie: Callable[[Any], bool],
) -> None:
    """Each SSE event forwarded as soon as it is whole, a `data:` event with usage rewritten."""
    await resp.prepare(request)
    pending = b""
    async for chunk in up.content.iter_any():
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        out = b"".join(_event(e, lie) + b"\n\n" for e in events)
        if out:
            await resp.write(out)
    if pending:
        await resp.write(pending)
    await resp.write_eof()


def _event(event: bytes, lie: Callable[[Any], bool]) -> bytes:
    if not event.startswith(b"data: {") or b'"usage"' not in event:
        return event
    return b"data: " + _rewritten(event[len(b"data: ") :], lie)


@contextmanager
def lying_proxy(
    upstream_base_url: str, lies: list[Lie] | None = None, seed: int = 0
) -> Iterator[LyingProxy]:
    """A `LyingProxy` serving on a free loopback port, on its own event loop in a daemon
    thread, in front of `upstream_base_url` (the simulator's `.../api/v1`)."""
    origin = upstream_base_url.split("/api/v1")[0]
    proxy = LyingProxy(origin, list(lies or []), seed)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> web.AppRunner:
        runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        proxy.port = runner.addresses[0][1]
        return runner

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            state["runner"] = loop.run_until_complete(start())
        except BaseException as exc:  # surfaced to the caller below
            state["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="lying-proxy", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if "error" in state:
        raise state["error"]
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
