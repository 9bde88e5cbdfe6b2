"""A model's provider endpoints on OpenRouter, and what a job's `provider` object does to them.

OpenRouter's routing rules, as its docs state them: `only` and `ignore` match a provider's
base slug (`deepinfra`: every DeepInfra endpoint), a full endpoint tag (`deepinfra/fp4`: that
endpoint only) or a display name; `quantizations` is an allow-list (`fp4` covers mxfp4 and
nvfp4, `fp8` covers mxfp8; an endpoint that states none counts as `unknown`); `max_price` is in
USD per million tokens; an endpoint whose max_completion_tokens is below the request's
max_tokens is not used. `regen providers` shows the verdict per endpoint; a run uses it to
refuse filters that leave nothing, and to know which display names only excluded endpoints
carry (an answer from one of those is `excluded_provider`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from regen.engine.client.account import JsonGetter

QUANT_FAMILIES = {"fp4": {"fp4", "mxfp4", "nvfp4"}, "fp8": {"fp8", "mxfp8"}}
PER_MTOK = 1e6


@dataclass(frozen=True)
class EndpointInfo:
    """One provider endpoint of a model, from `GET /models/{model}/endpoints`."""

    provider_name: str
    tag: str
    quantization: str | None
    prompt_usd_per_mtok: float | None
    completion_usd_per_mtok: float | None
    context_length: int | None
    max_completion_tokens: int | None
    uptime: float | None = None
    throughput_p50: float | None = None

    @property
    def slug(self) -> str:
        return self.tag.split("/", 1)[0]


def _num(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def parse_endpoints(body: Any) -> list[EndpointInfo]:
    data = body.get("data") if isinstance(body, dict) else None
    raw = data.get("endpoints") if isinstance(data, dict) else None
    out = []
    for e in raw if isinstance(raw, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("tag"), str):
            continue
        raw_pricing = e.get("pricing")
        pricing: dict[str, Any] = raw_pricing if isinstance(raw_pricing, dict) else {}
        prompt, completion = _num(pricing.get("prompt")), _num(pricing.get("completion"))
        throughput = e.get("throughput_last_30m")
        out.append(
            EndpointInfo(
                provider_name=str(e.get("provider_name") or e["tag"]),
                tag=e["tag"],
                quantization=e.get("quantization")
                if isinstance(e.get("quantization"), str)
                else None,
                prompt_usd_per_mtok=None if prompt is None else prompt * PER_MTOK,
                completion_usd_per_mtok=None if completion is None else completion * PER_MTOK,
                context_length=int(_num(e.get("context_length")) or 0) or None,
                max_completion_tokens=int(_num(e.get("max_completion_tokens")) or 0) or None,
                uptime=_num(e.get("uptime_last_30m")),
                throughput_p50=_num(throughput.get("p50"))
                if isinstance(throughput, dict)
                else None,
            )
        )
    return out


async def fetch_endpoints(client: JsonGetter, model: str) -> list[EndpointInfo]:
    return parse_endpoints(await client.get_json(f"models/{quote(model, safe='/')}/endpoints"))


def matches(pattern: Any, ep: EndpointInfo) -> bool:
    """A slug matches all of a provider's endpoints, a tag one endpoint, a display name all."""
    if not isinstance(pattern, str):
        return False
    p = pattern.strip().lower()
    return p in (ep.tag.lower(), ep.slug.lower(), ep.provider_name.lower())


def _allowed_quantizations(values: list[Any]) -> set[str]:
    allowed: set[str] = set()
    for v in values:
        allowed |= QUANT_FAMILIES.get(str(v).lower(), {str(v).lower()})
    return allowed


def verdicts(
    endpoints: list[EndpointInfo], provider: dict[str, Any] | None, max_tokens: int
) -> dict[str, str | None]:
    """Per endpoint tag: None if the job may use it, else the first filter that removes it."""
    prefs = provider or {}
    out: dict[str, str | None] = {}
    only, ignore = prefs.get("only"), prefs.get("ignore")
    quants = prefs.get("quantizations")
    allowed = _allowed_quantizations(quants) if isinstance(quants, list) else None
    raw_max = prefs.get("max_price")
    max_price: dict[str, Any] = raw_max if isinstance(raw_max, dict) else {}
    for ep in endpoints:
        reason = None
        if isinstance(only, list) and not any(matches(p, ep) for p in only):
            reason = "not in provider.only"
        elif isinstance(ignore, list) and any(matches(p, ep) for p in ignore):
            hit = next(p for p in ignore if matches(p, ep))
            reason = f"provider.ignore {hit!r}"
        elif allowed is not None and (ep.quantization or "unknown").lower() not in allowed:
            reason = f"quantization {ep.quantization or 'not stated'} not in provider.quantizations"
        else:
            for key, price in (
                ("prompt", ep.prompt_usd_per_mtok),
                ("completion", ep.completion_usd_per_mtok),
            ):
                limit = _num(max_price.get(key))
                if limit is not None and price is not None and price > limit:
                    reason = f"{key} price {price:g} $/Mtok over provider.max_price"
                    break
        if reason is None and ep.max_completion_tokens and ep.max_completion_tokens < max_tokens:
            reason = f"max_completion_tokens {ep.max_completion_tokens} < max_tokens {max_tokens}"
        out[ep.tag] = reason
    return out


def warnings(
    endpoints: list[EndpointInfo], provider: dict[str, Any] | None, verdict: dict[str, str | None]
) -> list[str]:
    """What a user would want to know before spending: exclusions that hit more or less than
    they probably meant, and filters that leave nothing."""
    prefs = provider or {}
    out = []
    for field in ("ignore", "only", "order"):
        entries = prefs.get(field)
        for p in entries if isinstance(entries, list) else []:
            hit = [e for e in endpoints if matches(p, e)]
            if not hit:
                out.append(f"provider.{field} {p!r} matches no endpoint of this model")
            elif field == "ignore" and len(hit) > 1 and "/" not in str(p):
                tags = ", ".join(e.tag for e in hit)
                out.append(
                    f"provider.ignore {p!r} drops all {len(hit)} {hit[0].provider_name} "
                    f"endpoints ({tags}); to drop one, name its tag, or keep some precisions "
                    "with provider.quantizations"
                )
            elif field == "ignore" and len(hit) == 1 and hit[0].tag == hit[0].slug:
                siblings = [e for e in endpoints if e.slug == hit[0].slug]
                if len(siblings) == 1:
                    out.append(
                        f"provider.ignore {p!r} is {hit[0].provider_name}'s only endpoint: the "
                        "whole provider is dropped"
                    )
    shared = shared_name_warning(endpoints, prefs, verdict)
    if shared is not None:
        out.append(shared)
    quants = prefs.get("quantizations")
    if isinstance(quants, list):
        unstated = [e.tag for e in endpoints if e.quantization is None]
        allowed = _allowed_quantizations(quants)
        if unstated and "unknown" not in allowed:
            out.append(
                f"{len(unstated)} endpoint(s) state no quantization ({', '.join(unstated)}) and "
                "are left out by the provider.quantizations allow-list"
            )
    if endpoints and all(v is not None for v in verdict.values()):
        out.append(
            "the filters leave no endpoint: every request would fail with 404 "
            "(constraint_filtered); relax provider.only/ignore/quantizations/max_price"
        )
    return out


def excluded_names(
    endpoints: list[EndpointInfo], verdict: dict[str, str | None]
) -> tuple[set[str], set[str]]:
    """Display names that only excluded endpoints carry (an answer naming one came from an
    excluded endpoint), and those shared by excluded and allowed endpoints (an answer naming
    one cannot be placed by its name alone)."""
    by_name: dict[str, list[bool]] = {}
    for e in endpoints:
        by_name.setdefault(e.provider_name, []).append(verdict.get(e.tag) is not None)
    only_excluded = {n for n, flags in by_name.items() if all(flags)}
    mixed = {n for n, flags in by_name.items() if any(flags) and not all(flags)}
    return only_excluded, mixed


def shared_name_warning(
    endpoints: list[EndpointInfo], provider: dict[str, Any] | None, verdict: dict[str, str | None]
) -> str | None:
    """An endpoint excluded by tag whose provider name an allowed endpoint shares cannot be
    told apart in an answer (OpenRouter's `provider` is the display name): said, with the
    allow-list of precisions that keeps it away at the router instead (None: no such one, or
    an allow-list is set)."""
    prefs = provider or {}
    allowed_eps = [e for e in endpoints if verdict.get(e.tag) is None]
    names = {e.provider_name for e in allowed_eps}
    shared = [e for e in endpoints if verdict.get(e.tag) is not None and e.provider_name in names]
    if not shared or "quantizations" in prefs:
        return None
    barred = {(e.quantization or "unknown").lower() for e in shared}
    keep = sorted(
        {
            q
            for e in allowed_eps
            if (q := (e.quantization or "unknown").lower())
            and not (_allowed_quantizations([q]) & barred)
        }
    )
    lost = [e.tag for e in allowed_eps if (e.quantization or "unknown").lower() not in keep]
    tags = ", ".join(e.tag for e in shared)
    who = ", ".join(sorted({e.provider_name for e in shared}))
    advice = (
        f"to exclude by precision at the router, use provider.quantizations = "
        f"{json.dumps(keep)}" + (f" (it also drops {', '.join(lost)})" if lost else "")
        if keep
        else "no allow-list of precisions keeps it out and another endpoint in"
    )
    return (
        f"{tags}: excluded, but {who} answers from allowed endpoints too, and an answer "
        f"names only the provider, so regen cannot tell them apart per answer; {advice}"
    )
