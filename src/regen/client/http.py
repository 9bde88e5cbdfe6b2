"""The aiohttp session: the only place regen touches aiohttp on the client side."""

from __future__ import annotations

import json
import time
from types import TracebackType
from typing import Any

import aiohttp

from regen.client.errors import class_of_status, error_from_body, parse_retry_after
from regen.client.response import parse_chat_body
from regen.conversation import Result
from regen.errors import EndpointError


class ChatClient:
    """One aiohttp session with a pool sized to the concurrency. Does not retry or schedule."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        concurrency: int,
        timeout_s: float,
        connect_timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._concurrency = concurrency
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ChatClient:
        # aiohttp's default pool caps at 100 connections: size it to the concurrency instead.
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, timeout=self._timeout
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def chat(self, item_id: str, body: dict[str, Any]) -> Result:
        """Send one request; return its Result or raise an EndpointError with its class."""
        assert self._session is not None, "use ChatClient as an async context manager"
        data = json.dumps(body, ensure_ascii=False).encode()
        started = time.monotonic()
        try:
            async with self._session.post(self.url, data=data) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        except TimeoutError as exc:
            raise EndpointError("timeout", "request timed out") from exc
        except aiohttp.ClientConnectionError as exc:
            raise EndpointError("connection", type(exc).__name__ + _detail(exc)) from exc
        except aiohttp.ClientError as exc:
            raise EndpointError("connection", type(exc).__name__ + _detail(exc)) from exc
        latency = time.monotonic() - started
        if status != 200:
            raise _http_error(status, raw, retry_after)
        return parse_chat_body(item_id, raw, status=status, latency_s=latency)


def _detail(exc: BaseException) -> str:
    text = str(exc)
    return f": {text[:200]}" if text else ""


def _http_error(status: int, raw: bytes, retry_after: float | None) -> EndpointError:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        # The HTTP status wins over a `code` in the body that disagrees with it.
        error = {**body["error"], "code": status}
        return error_from_body(error, status=status, retry_after_s=retry_after)
    text = raw[:200].decode("utf-8", "replace").strip() or "no body"
    return EndpointError(
        class_of_status(status, text),
        f"HTTP {status}: {text}",
        status=status,
        retry_after_s=retry_after,
    )
