"""What an OpenRouter account and model catalogue say: the key's usage and credit, and prices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from regen.conversation import Usage


class JsonGetter(Protocol):
    async def get_json(self, path: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """`GET /key`: what the key has used, and what it may still spend (None: no limit)."""

    usage_usd: float
    limit_remaining_usd: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


async def key_info(client: JsonGetter) -> KeyInfo | None:
    """The key's usage and remaining limit, or None when the endpoint does not say."""
    body = await client.get_json("key")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None
    usage = _number(data.get("usage"))
    if usage is None:
        return None
    return KeyInfo(usage, _number(data.get("limit_remaining")))


async def account_credit(client: JsonGetter) -> float | None:
    """The account's remaining credit from `GET /credits` (management keys only), or None."""
    body = await client.get_json("credits")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None
    total, used = _number(data.get("total_credits")), _number(data.get("total_usage"))
    return None if total is None or used is None else total - used


async def model_prices(client: JsonGetter, model: str) -> tuple[float, float] | None:
    """The highest prompt and completion prices (USD per token) among the model's endpoints,
    from `GET /models/{model}/endpoints`: an upper bound, whichever endpoint serves."""
    body = await client.get_json(f"models/{quote(model, safe='/')}/endpoints")
    data = body.get("data") if isinstance(body, dict) else None
    endpoints = data.get("endpoints") if isinstance(data, dict) else None
    prices: list[tuple[float, float]] = []
    for ep in endpoints if isinstance(endpoints, list) else []:
        pricing = ep.get("pricing") if isinstance(ep, dict) else None
        if not isinstance(pricing, dict):
            continue
        try:
            prices.append((float(pricing["prompt"]), float(pricing["completion"])))
        except (KeyError, TypeError, ValueError):
            continue
    if not prices:
        return None
    return max(p for p, _ in prices), max(c for _, c in prices)


async def generation_charge(
    client: JsonGetter, generation_id: str
) -> tuple[Usage, str | None] | None:
    """What the provider billed for a generation (`GET /generation?id=`), with the provider's
    name; None while the record is not there (it lags a few seconds behind the answer)."""
    body = await client.get_json(f"generation?id={quote(generation_id)}")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict):
        return None
    cost = _number(data.get("total_cost"))
    usage = Usage(
        int(_number(data.get("tokens_prompt")) or 0),
        int(_number(data.get("tokens_completion")) or 0),
        int(_number(data.get("native_tokens_reasoning")) or 0),
        cost,
    )
    provider = data.get("provider_name")
    return usage, provider if isinstance(provider, str) else None
