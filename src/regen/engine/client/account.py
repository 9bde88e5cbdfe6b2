"""What an OpenRouter account and model catalogue say: the key's usage and credit, and prices.

Every number read here is a provider's word: each passes the gate (`engine/gate.py`), which
takes a number that is no amount as unknown (None) and says so, once per source and field."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from regen.conversation import Usage
from regen.engine.client.response import MAX_COUNT, junk_fields
from regen.engine.gate import Gate, Listing, amount, listing


class JsonGetter(Protocol):
    async def get_json(self, path: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """`GET /key`: what the key has used, and what it may still spend (None: no limit)."""

    usage_usd: float
    limit_remaining_usd: float | None


def _credit(gate: Gate | None, data: dict[str, Any], name: str, channel: str) -> float | None:
    value = data.get(name)
    if gate is None:
        return amount(value)
    return gate.credit(value, channel=channel, what=name)


async def key_info(client: JsonGetter, gate: Gate | None = None) -> KeyInfo | None:
    """The key's usage and remaining limit, or None when the endpoint does not say (or says
    what is no amount: a usage of -5 or NaN is no usage)."""
    body = await client.get_json("key")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None
    usage = _credit(gate, data, "usage", "/key")
    if usage is None:
        return None
    return KeyInfo(usage, _credit(gate, data, "limit_remaining", "/key"))


async def account_credit(client: JsonGetter, gate: Gate | None = None) -> float | None:
    """The account's remaining credit from `GET /credits` (management keys only), or None."""
    body = await client.get_json("credits")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None
    total = _credit(gate, data, "total_credits", "/credits")
    used = _credit(gate, data, "total_usage", "/credits")
    return None if total is None or used is None else max(0.0, total - used)


async def model_listing(client: JsonGetter, model: str) -> Listing | None:
    """The model's endpoints' prices (USD per token) from `GET /models/{model}/endpoints`, as
    the gate lets them through (`gate.listing`): the highest valid ones, an upper bound
    whichever endpoint serves, and the lowest completion price, a bill's floor. None when the
    catalogue cannot be read."""
    body = await client.get_json(f"models/{quote(model, safe='/')}/endpoints")
    data = body.get("data") if isinstance(body, dict) else None
    endpoints = data.get("endpoints") if isinstance(data, dict) else None
    if not isinstance(endpoints, list):
        return None
    entries = []
    for k, ep in enumerate(endpoints):
        if not isinstance(ep, dict):
            continue
        pricing = ep.get("pricing")
        pricing = pricing if isinstance(pricing, dict) else {}
        name = ep.get("tag") or ep.get("provider_name") or ep.get("name") or f"endpoint {k + 1}"
        entries.append(
            (
                str(name),
                pricing.get("prompt"),
                pricing.get("completion"),
                pricing.get("input_cache_read"),
                pricing.get("input_cache_write"),
            )
        )
    return listing(model, entries)


GENERATION_FIELDS = ("total_cost", "tokens_prompt", "tokens_completion", "native_tokens_cached")
"""The fields of a `/generation` record that move money (the gate judges them)."""


async def generation_charge(
    client: JsonGetter, generation_id: str
) -> tuple[Usage, str | None] | None:
    """What the provider billed for a generation (`GET /generation?id=`), with the provider's
    name; None while the record is not there (it lags a few seconds behind the answer). Fields
    that are no amounts are in the usage's `junk` (named as the record names them)."""
    body = await client.get_json(f"generation?id={quote(generation_id)}")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None

    def count(name: str) -> int:
        number = amount(data.get(name))
        return 0 if number is None else int(min(number, MAX_COUNT))

    if data.get("total_cost") == 0 and data.get("finish_reason") == "error":
        # Zero-completion insurance: a generation that ended in an error is not billed,
        # whatever tokens it counted.
        return Usage(), _name(data)
    usage = Usage(
        count("tokens_prompt"),
        count("tokens_completion"),
        count("native_tokens_reasoning"),
        amount(data.get("total_cost")),
        junk=junk_fields(data, GENERATION_FIELDS),
        cached_tokens=_cached(data, count),
    )
    return usage, _name(data)


def _cached(data: dict[str, Any], count: Callable[[str], int]) -> int:
    """The record's cache reads (it counts no writes: its cache_discount nets both). They are
    in the provider's own tokens (`native_tokens_cached`), the prompt in normalized ones
    (`tokens_prompt`): reads within the native prompt are kept within the normalized one, so
    that a tokenizer's difference is not taken for junk (more than the native prompt is)."""
    cached, native = count("native_tokens_cached"), count("native_tokens_prompt")
    return min(cached, count("tokens_prompt")) if cached <= native else cached


def _name(data: dict[str, Any]) -> str | None:
    provider = data.get("provider_name")
    return provider if isinstance(provider, str) else None
