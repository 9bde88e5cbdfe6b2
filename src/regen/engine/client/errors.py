"""The failure taxonomy: every failed attempt gets exactly one class."""

from __future__ import annotations

import email.utils
import time
from typing import Any

from regen.errors import EndpointError

FAILURE_CLASSES = (
    "rate_limited",
    "overloaded",
    "server",
    "timeout",
    "stalled",
    "connection",
    "tls",
    "bad_request",
    "auth",
    "insufficient_credits",
    "moderation",
    "truncated",
    "invalid_response",
    "excluded_provider",
)
RETRYABLE = frozenset(
    {"rate_limited", "overloaded", "server", "timeout", "stalled", "connection", "invalid_response"}
)
# These end the whole run: no other request can succeed either.
STOPS_RUN = frozenset({"auth", "insufficient_credits", "tls"})


def class_of_status(status: int, message: str = "") -> str:
    """The class of an HTTP error status (also used for `error.code` inside a 200 body)."""
    if status == 401:
        return "auth"
    if status == 402:
        return "insufficient_credits"
    if status == 403:
        return "auth" if "key" in message.lower() else "moderation"
    if status in (408, 524):
        return "timeout"
    if status == 429:
        return "rate_limited"
    if status in (503, 529):
        return "overloaded"
    if status >= 500:
        return "server"
    return "bad_request"


def looks_like_html(raw: bytes) -> bool:
    """A body that is a web page (a proxy's error page, a site at the wrong base URL)."""
    head = raw[:200].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def error_from_body(
    error: Any, *, status: int | None, retry_after_s: float | None = None
) -> EndpointError:
    """An EndpointError from an OpenAI/OpenRouter `error` object (top-level or in a choice)."""
    if not isinstance(error, dict):
        return EndpointError("invalid_response", f"error field is {error!r}", status=status)
    message = str(error.get("message") or "no message")[:500]
    code = error.get("code")
    try:
        code_int = int(code) if code is not None else None
    except (TypeError, ValueError):
        code_int = None
    effective = code_int if code_int is not None and code_int >= 400 else status
    cls = class_of_status(effective, message) if effective and effective >= 400 else "server"
    availability = error.get("availability")
    if isinstance(availability, dict):
        ra = availability.get("retry_after")
        if isinstance(ra, int | float) and retry_after_s is None:
            retry_after_s = float(ra)
        if availability.get("retryable") is False and cls in RETRYABLE:
            cls = "bad_request"
    return EndpointError(cls, message, status=effective, retry_after_s=retry_after_s)
