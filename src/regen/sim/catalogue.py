"""OpenRouter's account and catalogue endpoints: /key, /credits, /generation, /models,
/models/{author}/{slug}/endpoints and /providers. (The key management API is in keys.py.)"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from regen.sim.account import Account, mask_key
from regen.sim.auth import authorize, authorize_manager
from regen.sim.config import SimCache, SimConfig, SimEndpoint
from regen.sim.keys import KeyStore
from regen.sim.respond import error_response


def _price_str(v: float) -> str:
    return f"{v:.12f}".rstrip("0").rstrip(".") or "0"


def _pricing(ep: SimEndpoint, cache: SimCache | None) -> dict[str, str]:
    """Prices as strings in USD per token; cache reads (and writes, where they are not the
    prompt price) only for an endpoint that caches."""
    out = {
        "prompt": _price_str(ep.prompt_price),
        "completion": _price_str(ep.completion_price),
        "request": "0",
        "image": "0",
    }
    if cache is not None:
        out["input_cache_read"] = _price_str(ep.prompt_price * cache.read_multiplier)
        if cache.write_multiplier != 1:
            out["input_cache_write"] = _price_str(ep.prompt_price * cache.write_multiplier)
    return out


class Catalogue:
    """Handlers that read the config and the account; they never change state."""

    def __init__(self, config: SimConfig, account: Account, keys: KeyStore) -> None:
        self.config = config
        self.account = account
        self.keys = keys

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/models/{author}/{slug}/endpoints", self.endpoints)
        app.router.add_get("/api/v1/providers", self.providers)
        app.router.add_get("/api/v1/key", self.key)
        app.router.add_get("/api/v1/credits", self.credits)
        app.router.add_get("/api/v1/generation", self.generation)
        for prefix in ("/api/v1", "/v1"):
            app.router.add_get(f"{prefix}/models", self.models)

    async def key(self, request: web.Request) -> web.Response:
        """The calling key: its own usage; a created key's own limit, any other key's limit
        being the account's credit."""
        key = authorize(self.config, self.keys, request)
        if isinstance(key, web.Response):
            return key
        a = self.account
        usage = a.usage_record(key)
        managed = self.keys.of_secret(key)
        if managed is not None:
            own: dict[str, Any] = {
                "label": managed.label,
                "limit": managed.limit,
                "limit_remaining": managed.remaining(usage),
                "limit_reset": managed.limit_reset,
                "include_byok_in_limit": managed.include_byok_in_limit,
                "expires_at": managed.expires_at,
            }
        else:
            own = {
                "label": mask_key(key),
                "limit": a.credits_usd,
                "limit_remaining": a.remaining_usd,
                "limit_reset": None,
                "include_byok_in_limit": False,
                "expires_at": None,
            }
        return web.json_response(
            {
                "data": {
                    **own,
                    **usage.usage(),
                    "byok_usage": 0,
                    "byok_usage_daily": 0,
                    "byok_usage_weekly": 0,
                    "byok_usage_monthly": 0,
                    "is_free_tier": False,
                    "is_management_key": key in self.config.management_keys,
                    "rate_limit": {
                        "interval": "1h",
                        "requests": -1,
                        "note": "This field is deprecated and safe to ignore.",
                    },
                }
            }
        )

    async def credits(self, request: web.Request) -> web.Response:
        key = authorize_manager(self.config, self.keys, request)
        if isinstance(key, web.Response):
            return key
        total = self.account.credits_usd
        return web.json_response(
            {
                "data": {
                    "total_credits": total if total is not None else 1e9,
                    "total_usage": self.account.used_usd,
                }
            }
        )

    async def generation(self, request: web.Request) -> web.Response:
        key = authorize(self.config, self.keys, request)
        if isinstance(key, web.Response):
            return key
        # Any key of the account sees every generation of the account.
        data = self.account.generation(request.query.get("id", ""), self.config.generation_delay_s)
        if data is None:
            return error_response(404, "Generation not found")
        return web.json_response({"data": data})

    async def models(self, request: web.Request) -> web.Response:
        data = []
        for m in self.config.models:
            cheapest = min(m.endpoints, key=lambda e: e.completion_price)
            data.append(
                {
                    "id": m.id,
                    "canonical_slug": m.id,
                    "name": m.id,
                    "context_length": m.context_length,
                    "architecture": {
                        "tokenizer": "Other",
                        "instruct_type": None,
                        "input_modalities": ["text"],
                        "output_modalities": ["text"],
                    },
                    "pricing": _pricing(cheapest, self.config.cache_of(cheapest)),
                    "top_provider": {
                        "context_length": m.context_length,
                        "max_completion_tokens": max(e.max_completion_tokens for e in m.endpoints),
                        "is_moderated": False,
                    },
                    "supported_parameters": sorted(
                        {p for e in m.endpoints for p in e.supported_parameters}
                    ),
                    "reasoning": {"mandatory": False, "default_enabled": m.reasoning},
                }
            )
        return web.json_response({"data": data})

    async def endpoints(self, request: web.Request) -> web.Response:
        model_id = f"{request.match_info['author']}/{request.match_info['slug']}"
        model = self.config.model(model_id)
        if model is None:
            return error_response(404, f"Model {model_id} not found")
        eps = [
            {
                "name": f"{e.provider_name} | {model.id}",
                "model_id": model.id,
                "model_name": model.id,
                "provider_name": e.provider_name,
                "tag": e.tag,
                "quantization": e.quantization,
                "context_length": e.context_length,
                "max_completion_tokens": e.max_completion_tokens,
                "max_prompt_tokens": e.context_length,
                "pricing": _pricing(e, self.config.cache_of(e)),
                "supported_parameters": e.supported_parameters,
                "status": 0,
                "uptime_last_30m": 100.0,
                "supports_implicit_caching": self.config.cache_of(e) is not None,
                "latency_last_30m": {
                    "p50": e.ttft_s * 1000,
                    "p75": e.ttft_s * 1200,
                    "p90": e.ttft_s * 1500,
                    "p99": e.ttft_s * 2500,
                },
                "throughput_last_30m": {
                    "p50": e.tokens_per_s,
                    "p75": e.tokens_per_s * 0.9,
                    "p90": e.tokens_per_s * 0.8,
                    "p99": e.tokens_per_s * 0.6,
                },
            }
            for e in model.endpoints
        ]
        return web.json_response(
            {
                "data": {
                    "id": model.id,
                    "name": model.id,
                    "created": 0,
                    "description": "",
                    "architecture": {
                        "tokenizer": "Other",
                        "instruct_type": None,
                        "input_modalities": ["text"],
                        "output_modalities": ["text"],
                    },
                    "endpoints": eps,
                }
            }
        )

    async def providers(self, request: web.Request) -> web.Response:
        seen: dict[str, str] = {}
        for m in self.config.models:
            for e in m.endpoints:
                seen.setdefault(e.slug, e.provider_name)
        return web.json_response(
            {
                "data": [
                    {
                        "name": name,
                        "slug": slug,
                        "privacy_policy_url": None,
                        "terms_of_service_url": None,
                        "status_page_url": None,
                    }
                    for slug, name in sorted(seen.items())
                ]
            }
        )
