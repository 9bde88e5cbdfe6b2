"""Bearer-key checks shared by every simulated endpoint."""

from __future__ import annotations

from aiohttp import web

from regen.sim.config import SimConfig
from regen.sim.respond import error_response


def key_of(config: SimConfig, request: web.Request) -> str | None:
    """The request's key if it is accepted (any non-empty key unless `api_keys` is set)."""
    header = request.headers.get("Authorization", "")
    key = header[7:].strip() if header.startswith("Bearer ") else ""
    if not key or (config.api_keys and key not in config.api_keys):
        return None
    return key


def denied(request: web.Request) -> web.Response:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or not header[7:].strip():
        return error_response(401, "No auth credentials found")
    return error_response(401, "User not found.")
