"""OpenRouter's provider routing, as its docs describe it: filters, then an order to try.

Slug matching: a base slug (`deepinfra`) matches every endpoint of that provider; a full tag
(`deepinfra/fp4`) matches only that endpoint. Display names are accepted too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from regen.sim.config import SimEndpoint

# The docs: `fp4` includes mxfp4 and nvfp4, `fp8` includes mxfp8.
_QUANT_FAMILIES = {"fp4": {"fp4", "mxfp4", "nvfp4"}, "fp8": {"fp8", "mxfp8"}}
PRICE_UNIT = 1e6  # max_price is in USD per million tokens


@dataclass
class Route:
    """Endpoints to try in order, or why none are left."""

    endpoints: list[SimEndpoint]
    excluded_by: list[str] = field(default_factory=list)
    constraint: dict[str, str] | None = None


def matches(pattern: Any, ep: SimEndpoint) -> bool:
    if not isinstance(pattern, str):
        return False
    p = pattern.strip().lower()
    return p in (ep.tag.lower(), ep.slug.lower(), ep.provider_name.lower())


def _allowed_quantizations(values: list[Any]) -> set[str]:
    allowed: set[str] = set()
    for v in values:
        v = str(v).lower()
        allowed |= _QUANT_FAMILIES.get(v, {v})
    return allowed


def _price(ep: SimEndpoint) -> float:
    return ep.prompt_price + ep.completion_price


def route(
    endpoints: list[SimEndpoint],
    provider: Any,
    *,
    max_tokens: int,
    params: set[str],
    rng: random.Random,
) -> Route:
    """The endpoints a request may use, in the order they are tried."""
    prefs: dict[str, Any] = provider if isinstance(provider, dict) else {}
    eps = list(endpoints)
    excluded: list[str] = []
    constraint: dict[str, str] | None = None

    def drop(keep: list[SimEndpoint], reason: str, fld: str, detail: str) -> None:
        nonlocal eps, constraint
        if len(keep) < len(eps):
            excluded.append(reason)
            constraint = {"field": fld, "detail": detail}
        eps = keep

    only = prefs.get("only")
    if isinstance(only, list):
        drop(
            [e for e in eps if any(matches(p, e) for p in only)],
            "allowed_providers",
            "provider.only",
            f"only {only}",
        )
    ignore = prefs.get("ignore")
    if isinstance(ignore, list):
        drop(
            [e for e in eps if not any(matches(p, e) for p in ignore)],
            "allowed_providers",
            "provider.ignore",
            f"ignore {ignore}",
        )
    quants = prefs.get("quantizations")
    if isinstance(quants, list):
        allowed = _allowed_quantizations(quants)
        drop(
            [e for e in eps if (e.quantization or "unknown").lower() in allowed],
            "quantization",
            "provider.quantizations",
            f"allowed {quants}",
        )
    if prefs.get("zdr") is True:
        drop([e for e in eps if e.zdr], "data_policy:zdr", "provider.zdr", "zdr only")
    if prefs.get("data_collection") == "deny":
        drop(
            [e for e in eps if not e.trains_on_data],
            "data_policy:training",
            "provider.data_collection",
            "deny",
        )
    max_price = prefs.get("max_price")
    if isinstance(max_price, dict):
        keep = eps
        for key, attr in (("prompt", "prompt_price"), ("completion", "completion_price")):
            limit = max_price.get(key)
            if isinstance(limit, int | float):
                keep = [e for e in keep if getattr(e, attr) * PRICE_UNIT <= limit]
        drop(keep, "max_price", "provider.max_price", str(max_price))
    drop(
        [e for e in eps if e.max_completion_tokens >= max_tokens],
        "context_length",
        "max_tokens",
        f"max_tokens {max_tokens}",
    )
    if prefs.get("require_parameters") is True:
        drop(
            [e for e in eps if params <= set(e.supported_parameters)],
            "require_parameters",
            "provider.require_parameters",
            f"parameters {sorted(params)}",
        )

    order = prefs.get("order")
    sort = prefs.get("sort")
    sort_by = sort.get("by") if isinstance(sort, dict) else sort
    if isinstance(order, list) and order:
        first: list[SimEndpoint] = []
        for p in order:
            first += [e for e in eps if matches(p, e) and e not in first]
        rest = [e for e in eps if e not in first]
        eps = first + (_balanced(rest, rng) if prefs.get("allow_fallbacks", True) else [])
        if not eps:
            excluded.append("allowed_providers")
            constraint = {"field": "provider.order", "detail": f"order {order}"}
    elif sort_by == "price":
        eps.sort(key=_price)
    elif sort_by == "throughput":
        eps.sort(key=lambda e: -e.tokens_per_s)
    elif sort_by == "latency":
        eps.sort(key=lambda e: e.ttft_s)
    else:
        eps = _balanced(eps, rng)
    return Route(eps, excluded if not eps else [], constraint if not eps else None)


def _balanced(eps: list[SimEndpoint], rng: random.Random) -> list[SimEndpoint]:
    """OpenRouter's default: load-balance by inverse-square price; the rest are fallbacks."""
    pool, out = list(eps), []
    while pool:
        weights = [1.0 / max(_price(e), 1e-12) ** 2 for e in pool]
        pick = rng.choices(range(len(pool)), weights=weights, k=1)[0]
        out.append(pool.pop(pick))
    return out
