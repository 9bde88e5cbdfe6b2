"""Bearer-key checks shared by every simulated OpenRouter endpoint.

Accepted: any non-empty key (or only `api_keys` when set), every management key, and every
key created through `/api/v1/keys` that is neither disabled nor expired. A deleted key is
refused like an unknown one. Management keys are refused by the completion endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from regen.sim.config import SimConfig
from regen.sim.respond import error_response

if TYPE_CHECKING:
    from regen.sim.keys import KeyStore

NO_CREDENTIALS = "No auth credentials found"
UNKNOWN_KEY = "User not found."
DISABLED_KEY = "This API key is disabled"
EXPIRED_KEY = "This API key has expired"
MANAGEMENT_ONLY = "Only management keys can perform this operation"
NOT_FOR_COMPLETIONS = (
    "Management keys cannot be used for completions: they only manage API keys and read "
    "credits. Make this request with an API key"
)


def bearer(request: web.Request) -> str:
    """The request's bearer key, or "" without one."""
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.startswith("Bearer ") else ""


def authorize(
    config: SimConfig, keys: KeyStore, request: web.Request, *, completions: bool = False
) -> str | web.Response:
    """The request's key if it is accepted, else the 401 to answer with. `completions`: the
    request is for the completion endpoint, which management keys may not use."""
    key = bearer(request)
    if not key:
        return error_response(401, NO_CREDENTIALS)
    managed = keys.of_secret(key)
    if managed is not None:
        if managed.disabled:
            return error_response(401, DISABLED_KEY)
        if managed.expired():
            return error_response(401, EXPIRED_KEY)
        return key
    if key in config.management_keys:
        return error_response(401, NOT_FOR_COMPLETIONS) if completions else key
    if keys.was_deleted(key) or (config.api_keys and key not in config.api_keys):
        return error_response(401, UNKNOWN_KEY)
    return key


def authorize_manager(
    config: SimConfig, keys: KeyStore, request: web.Request
) -> str | web.Response:
    """The request's key if it is a management key; 401 or 403 otherwise."""
    key = authorize(config, keys, request)
    if isinstance(key, str) and key not in config.management_keys:
        return error_response(403, MANAGEMENT_ONLY)
    return key
