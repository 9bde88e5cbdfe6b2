"""OpenRouter's key management API, `/api/v1/keys` (management keys only), and the keys it
creates.

As OpenRouter's OpenAPI (2026) has it: `POST /keys` (201, the secret shown only then),
`GET /keys` (`include_disabled`, `offset`; newest first, 100 a page), `GET`, `PATCH` and
`DELETE /keys/{hash}` (the hash is the SHA-256 of the secret). A created key is a normal key
everywhere else: it makes completions and reads /key, /generation and the catalogue, and its
`limit` caps what it may spend (checked in server.py when a request starts, against what the
key was billed so far).

Secrets come from the sim's seed and a counter, never from the clock: the same run of a test
creates the same keys.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from regen.sim.account import Account, KeyUsage, LimitReset
from regen.sim.auth import authorize_manager
from regen.sim.config import SimConfig
from regen.sim.respond import error_response

LIMIT_RESETS: tuple[LimitReset, ...] = ("daily", "weekly", "monthly")
PAGE_SIZE = 100
WORKSPACE_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "https://regen.invalid/sim/workspace"))
"""The one workspace every simulated key belongs to."""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class ManagedKey:
    """A key created through the management API."""

    secret: str
    name: str
    limit: float | None
    limit_reset: LimitReset | None
    include_byok_in_limit: bool
    expires_at: str | None
    expires_ts: float | None
    created_at: str
    updated_at: str | None = None
    disabled: bool = False
    hash: str = field(init=False)
    """SHA-256 of the secret, in hex: how the management API names the key."""

    def __post_init__(self) -> None:
        self.hash = hashlib.sha256(self.secret.encode()).hexdigest()

    @property
    def label(self) -> str:
        """The secret masked, as OpenRouter labels a key (`sk-or-v1-0e6...1c96`)."""
        return f"{self.secret[:12]}...{self.secret[-4:]}"

    def expired(self, now: float | None = None) -> bool:
        if self.expires_ts is None:
            return False
        return (time.time() if now is None else now) >= self.expires_ts

    def remaining(self, usage: KeyUsage) -> float | None:
        """What the key may still spend: its limit less its usage in the limit's period
        (negative when requests in flight took it past the limit)."""
        if self.limit is None:
            return None
        return self.limit - usage.counted(self.limit_reset)

    def view(self, usage: KeyUsage) -> dict[str, Any]:
        """The key object of the management API (never the secret)."""
        return {
            "hash": self.hash,
            "name": self.name,
            "label": self.label,
            "disabled": self.disabled,
            "limit": self.limit,
            "limit_remaining": self.remaining(usage),
            "limit_reset": self.limit_reset,
            "include_byok_in_limit": self.include_byok_in_limit,
            **usage.usage(),
            "byok_usage": 0,
            "byok_usage_daily": 0,
            "byok_usage_weekly": 0,
            "byok_usage_monthly": 0,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "creator_user_id": None,
            "workspace_id": WORKSPACE_ID,
            "expires_at": self.expires_at,
        }


class KeyStore:
    """The keys created through the management API, by secret and by hash."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.created = 0
        """Keys created so far (the counter their secrets are drawn from)."""
        self._by_secret: dict[str, ManagedKey] = {}
        self._by_hash: dict[str, ManagedKey] = {}
        self._deleted: set[str] = set()

    def new_secret(self) -> str:
        rng = random.Random(f"regen-sim-key:{self.seed}:{self.created}")
        self.created += 1
        return f"sk-or-v1-{rng.getrandbits(256):064x}"

    def add(self, key: ManagedKey) -> None:
        self._by_secret[key.secret] = key
        self._by_hash[key.hash] = key

    def of_secret(self, secret: str) -> ManagedKey | None:
        return self._by_secret.get(secret)

    def of_hash(self, key_hash: str) -> ManagedKey | None:
        return self._by_hash.get(key_hash)

    def delete(self, key: ManagedKey) -> None:
        del self._by_secret[key.secret], self._by_hash[key.hash]
        self._deleted.add(key.secret)

    def was_deleted(self, secret: str) -> bool:
        return secret in self._deleted

    def listed(self, include_disabled: bool) -> list[ManagedKey]:
        """Newest first, as OpenRouter lists "the most recent" keys."""
        keys = reversed(self._by_secret.values())
        return [k for k in keys if include_disabled or not k.disabled]


def _fields(body: Any, *, creating: bool) -> dict[str, Any] | str:
    """The request's fields, checked as the OpenAPI schema types them; a message if not."""
    if not isinstance(body, dict):
        return "Request body must be a JSON object"
    out: dict[str, Any] = {}
    if creating or "name" in body:
        name = body.get("name")
        if not isinstance(name, str) or not name:
            return "name: expected a non-empty string"
        out["name"] = name
    if "limit" in body:
        limit = body["limit"]
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit < 0
        ):
            return "limit: expected a number of USD (0 or more) or null"
        out["limit"] = None if limit is None else float(limit)
    if "limit_reset" in body:
        reset = body["limit_reset"]
        if reset is not None and reset not in LIMIT_RESETS:
            return 'limit_reset: expected "daily", "weekly", "monthly" or null'
        out["limit_reset"] = reset
    flags = ("include_byok_in_limit",) if creating else ("include_byok_in_limit", "disabled")
    for flag in flags:
        if flag in body:
            if not isinstance(body[flag], bool):
                return f"{flag}: expected a boolean"
            out[flag] = body[flag]
    if creating and body.get("expires_at") is not None:
        raw = body["expires_at"]
        try:
            when = datetime.fromisoformat(raw) if isinstance(raw, str) else None
        except ValueError:
            when = None
        offset = when.utcoffset() if when is not None else None
        if when is None or offset is None or offset.total_seconds() != 0:
            return "expires_at: expected an ISO 8601 timestamp in UTC"
        out["expires_at"], out["expires_ts"] = raw, when.timestamp()
    return out


class KeysApi:
    """The `/api/v1/keys` handlers."""

    def __init__(self, config: SimConfig, account: Account, keys: KeyStore) -> None:
        self.config, self.account, self.keys = config, account, keys

    def add_routes(self, app: web.Application) -> None:
        for path in ("/api/v1/keys", "/api/v1/keys/"):
            app.router.add_post(path, self.create)
            app.router.add_get(path, self.list_keys)
        app.router.add_get("/api/v1/keys/{hash}", self.get)
        app.router.add_patch("/api/v1/keys/{hash}", self.update)
        app.router.add_delete("/api/v1/keys/{hash}", self.delete)

    def _view(self, key: ManagedKey) -> dict[str, Any]:
        return key.view(self.account.usage_record(key.secret))

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
            return None

    def _found(self, request: web.Request) -> ManagedKey | web.Response:
        denied = authorize_manager(self.config, self.keys, request)
        if isinstance(denied, web.Response):
            return denied
        key = self.keys.of_hash(request.match_info["hash"])
        if key is None:
            return error_response(404, "API key not found")
        return key

    async def create(self, request: web.Request) -> web.Response:
        denied = authorize_manager(self.config, self.keys, request)
        if isinstance(denied, web.Response):
            return denied
        fields = _fields(await self._body(request), creating=True)
        if isinstance(fields, str):
            return error_response(400, fields)
        key = ManagedKey(
            secret=self.keys.new_secret(),
            name=fields["name"],
            limit=fields.get("limit"),
            limit_reset=fields.get("limit_reset"),
            include_byok_in_limit=fields.get("include_byok_in_limit", False),
            expires_at=fields.get("expires_at"),
            expires_ts=fields.get("expires_ts"),
            created_at=_iso(time.time()),
        )
        self.keys.add(key)
        return web.json_response({"data": self._view(key), "key": key.secret}, status=201)

    async def list_keys(self, request: web.Request) -> web.Response:
        denied = authorize_manager(self.config, self.keys, request)
        if isinstance(denied, web.Response):
            return denied
        flag = request.query.get("include_disabled", "false").lower()
        if flag not in ("true", "false"):
            return error_response(400, "include_disabled: expected true or false")
        raw_offset = request.query.get("offset", "0")
        if not raw_offset.isdigit():
            return error_response(400, "offset: expected a whole number, 0 or more")
        offset = int(raw_offset)
        page = self.keys.listed(flag == "true")[offset : offset + PAGE_SIZE]
        return web.json_response({"data": [self._view(k) for k in page]})

    async def get(self, request: web.Request) -> web.Response:
        key = self._found(request)
        if isinstance(key, web.Response):
            return key
        return web.json_response({"data": self._view(key)})

    async def update(self, request: web.Request) -> web.Response:
        key = self._found(request)
        if isinstance(key, web.Response):
            return key
        fields = _fields(await self._body(request), creating=False)
        if isinstance(fields, str):
            return error_response(400, fields)
        for name, value in fields.items():
            setattr(key, name, value)
        key.updated_at = _iso(time.time())
        return web.json_response({"data": self._view(key)})

    async def delete(self, request: web.Request) -> web.Response:
        key = self._found(request)
        if isinstance(key, web.Response):
            return key
        self.keys.delete(key)
        return web.json_response({"deleted": True})
