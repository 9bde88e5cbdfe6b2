"""OpenRouter's key management API (`/api/v1/keys`), called with a management key.

A management key cannot call completions; it creates, reads, changes and deletes the
account's API keys. Every failure comes back as a KeyApiError naming what was refused and why,
never the key itself.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from regen.engine.client.errors import brief
from regen.engine.client.response import loads_answer
from regen.engine.gate import amount


class KeyApiError(Exception):
    """A call to `/keys` that did not succeed: its HTTP status (None: no answer) and why."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What `/keys/{hash}` says of one key."""

    hash: str
    name: str
    usage_usd: float | None
    """None: the record's usage is no amount (negative, not finite, text): not known."""
    limit_usd: float | None
    disabled: bool


def _record(data: Any) -> KeyRecord:
    if not isinstance(data, dict) or not isinstance(data.get("hash"), str):
        raise KeyApiError(200, "the answer holds no key object")
    usage = data.get("usage")
    return KeyRecord(
        data["hash"],
        str(data.get("name") or ""),
        0.0 if usage is None else amount(usage),
        amount(data.get("limit")),
        bool(data.get("disabled")),
    )


class KeyApi:
    """`/keys` of one OpenRouter base URL, with a management key."""

    def __init__(
        self, base_url: str, management_key: str, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/keys"
        self._headers = {
            "Authorization": f"Bearer {management_key}",
            "Content-Type": "application/json",
        }
        self._ssl: ssl.SSLContext | bool = ssl_context or True
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KeyApi:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2, ssl=self._ssl), headers=self._headers
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

    async def _call(
        self, method: str, path: str = "", body: Any = None, *, url: str | None = None
    ) -> Any:
        assert self._session is not None, "use KeyApi as an async context manager"
        url = url or self.url + path
        try:
            async with self._session.request(
                method,
                url,
                data=None if body is None else orjson.dumps(body),
                timeout=aiohttp.ClientTimeout(total=30),
                allow_redirects=False,  # a management key goes to base_url's host alone
            ) as resp:
                raw = await resp.read()
                status = resp.status
                location = resp.headers.get("Location")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KeyApiError(None, f"{method} {url}: {type(exc).__name__}") from exc
        try:
            doc = loads_answer(raw) if raw.strip() else None  # NaN read: the gate's to judge
        except orjson.JSONDecodeError:
            doc = None
        if 300 <= status < 400:
            raise KeyApiError(
                status,
                f"{method} {url}: HTTP {status} redirect to {brief(location or 'nowhere', 200)}: "
                "not followed; set [endpoint].base_url to the API's own address",
            )
        if status >= 400:
            message = ""
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                message = str(doc["error"].get("message") or "")
            raise KeyApiError(status, f"{method} {url}: HTTP {status} {message[:200]}".strip())
        return doc

    async def create(self, name: str, limit_usd: float | None) -> tuple[KeyRecord, str]:
        """A new key with this credit limit (None: none): its record and its secret, which
        the answer carries once and which must never be written anywhere."""
        doc = await self._call("POST", "", {"name": name, "limit": limit_usd})
        secret = doc.get("key") if isinstance(doc, dict) else None
        if not isinstance(secret, str) or not secret:
            raise KeyApiError(201, f"POST {self.url}: the answer carries no key")
        return _record(doc.get("data")), secret

    async def get(self, key_hash: str) -> KeyRecord:
        doc = await self._call("GET", "/" + quote(key_hash))
        return _record(doc.get("data") if isinstance(doc, dict) else None)

    async def update(self, key_hash: str, **fields: Any) -> KeyRecord:
        """Change a key's `limit`, `disabled` or `name`."""
        doc = await self._call("PATCH", "/" + quote(key_hash), fields)
        return _record(doc.get("data") if isinstance(doc, dict) else None)

    async def delete(self, key_hash: str) -> None:
        await self._call("DELETE", "/" + quote(key_hash))

    async def credit(self) -> float | None:
        """The account's remaining credit (`GET /credits`), or None when it cannot be read."""
        try:
            doc = await self._call("GET", url=self.base_url + "/credits")
        except KeyApiError:
            return None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict):
            return None
        total, used = amount(data.get("total_credits")), amount(data.get("total_usage"))
        if total is None or used is None:
            return None
        return max(0.0, total - used)
