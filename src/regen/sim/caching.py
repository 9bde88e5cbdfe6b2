"""OpenRouter's prompt caching, as its prompt-caching guide describes it: each provider endpoint
keeps a prefix cache (prefix_cache.py) and bills cache reads and writes at its own multipliers
of the prompt price; after a cached request, the conversation sticks to that endpoint.

Sticky routing, per the guide: later requests of the same account and model, and the same
conversation (its `session_id`, else the `x-session-id` header, else `prompt_cache_key`, else
a hash of its first system message and first other message), go to the endpoint that served
it, until `sticky_s` (10 minutes) pass without one; only where the endpoint's cache reads cost
less than its prompt; never when the request sets `provider.order`.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from regen.sim.config import SimCache, SimEndpoint
from regen.sim.prefix_cache import CacheUse, PrefixCache


def conversation_key(body: dict[str, Any], session_header: str | None) -> str | None:
    """What keeps a request on its provider: its session, else its conversation's hash. None
    when sticky routing does not apply (`provider.order` is set)."""
    provider = body.get("provider")
    if isinstance(provider, dict) and provider.get("order"):
        return None
    for session in (body.get("session_id"), session_header, body.get("prompt_cache_key")):
        if isinstance(session, str) and session:
            return "session:" + session
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = next((m for m in messages if m.get("role") in ("system", "developer")), None)
    first = next((m for m in messages if m.get("role") not in ("system", "developer")), None)
    text = json.dumps([system, first], sort_keys=True, default=str).encode()
    return "hash:" + hashlib.blake2b(text, digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class PromptBill:
    """A prompt's cost with its cache reads and writes."""

    cost_usd: float
    full_usd: float
    """What it would have cost with no cache."""
    cached: int
    written: int
    """Tokens billed as cache writes (0 where the provider bills no writes of its own)."""

    @property
    def discount_usd(self) -> float:
        """`cache_discount` on /generation: what the cache saved (negative when writes cost
        more than they saved)."""
        return self.full_usd - self.cost_usd


def prompt_bill(
    prompt_tokens: int, endpoint: SimEndpoint, cache: SimCache | None, use: CacheUse
) -> PromptBill:
    """prompt_price x (prompt - cached + cached x read_multiplier + written x
    (write_multiplier - 1)): reads at their price, writes at theirs, the rest at full price."""
    price = endpoint.prompt_price
    full = prompt_tokens * price
    if cache is None:
        return PromptBill(full, full, 0, 0)
    written = use.written if cache.write_multiplier != 1 else 0
    cost = price * (
        prompt_tokens
        - use.cached
        + use.cached * cache.read_multiplier
        + written * (cache.write_multiplier - 1)
    )
    return PromptBill(cost, full, use.cached, written)


class ProviderCaches:
    """Every endpoint's prefix cache (by model and tag), and the sticky routes."""

    def __init__(self, sticky_s: float) -> None:
        self._caches: dict[tuple[str, str], PrefixCache] = {}
        self._sticky: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        """(model, conversation) -> (endpoint tag, last request), oldest first."""
        self._sticky_s = sticky_s

    def use(
        self,
        model: str,
        endpoint: SimEndpoint,
        cache: SimCache,
        ids: list[int],
        now: float,
        ready: Callable[[int], float] | None = None,
    ) -> CacheUse:
        """The endpoint's cache read and written by one prompt (`PrefixCache.use`)."""
        key = (model, endpoint.tag)
        store = self._caches.get(key)
        if store is None:
            store = self._caches[key] = PrefixCache(
                cache.block_tokens, cache.capacity_tokens, cache.ttl_s
            )
        return store.use(ids, now, ready)

    def sticky(self, model: str, conversation: str | None, now: float) -> str | None:
        """The endpoint tag the conversation sticks to, if it still does."""
        if conversation is None:
            return None
        entry = self._sticky.get((model, conversation))
        if entry is None or now - entry[1] > self._sticky_s:
            return None
        return entry[0]

    def stick(
        self,
        model: str,
        conversation: str | None,
        endpoint: SimEndpoint,
        cache: SimCache | None,
        now: float,
    ) -> None:
        """After a cached request: keep the conversation on this endpoint (only where cache
        reads are cheaper than the prompt price)."""
        if conversation is not None and cache is not None and cache.read_multiplier < 1:
            self._sticky[(model, conversation)] = (endpoint.tag, now)
            self._sticky.move_to_end((model, conversation))
        # Routes idle past their time are dropped as they go: a job of a million
        # conversations does not keep a million routes.
        while self._sticky and now - next(iter(self._sticky.values()))[1] > self._sticky_s:
            self._sticky.popitem(last=False)

    def sticky_routes(self) -> int:
        """Sticky routes held (expired ones are dropped as later requests are served)."""
        return len(self._sticky)
