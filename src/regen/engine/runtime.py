"""What a run holds of its lanes and endpoints: how to reach each server, its share of a lane,
its health and busy time, and the lane's settings and adaptive limits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from regen.conversation import Request, Result
from regen.engine.budget import Prices
from regen.engine.client.http import Timeouts
from regen.engine.limiter import AdaptiveLimit, EndpointHealth


class Sender(Protocol):
    async def chat(
        self,
        item_id: str,
        body: dict[str, Any],
        *,
        stream: bool = False,
        timeouts: Timeouts | None = None,
        on_generation: Callable[[str], None] | None = None,
    ) -> Result: ...

    async def get_json(self, path: str) -> Any: ...

    async def probe(self, url: str) -> bool: ...


@dataclass
class BusyClock:
    """The time a server had at least one of the job's requests on the wire, not yet charged
    to an answer."""

    on_wire: int = 0
    since: float = 0.0
    unbilled_s: float = 0.0

    def change(self, now: float, delta: int) -> None:
        if self.on_wire > 0:
            self.unbilled_s += now - self.since
        self.since = now
        self.on_wire += delta

    def take(self, now: float) -> float:
        """The busy seconds since the last take."""
        self.change(now, 0)
        taken, self.unbilled_s = self.unbilled_s, 0.0
        return taken


@dataclass
class EndpointRuntime:
    """One endpoint as a lane uses it: how to reach it, its share, its health."""

    name: str
    sender: Sender
    make_body: Callable[[Request, int, bool], dict[str, Any]]
    """The request body for a request, given the lane's max_tokens and whether it streams."""
    weight: float = 1.0
    health: EndpointHealth = field(default_factory=EndpointHealth)
    prices: Prices | None = None
    """For answers without `usage.cost`, and for the worst case under dollar caps."""
    generation_records: bool = False
    """The endpoint answers `GET /generation?id=` (OpenRouter): a stream cut short can be
    looked up there for what it was billed."""
    job_key: bool = False
    """Requests go out with a key made for this run (`job_keys.py`), whose credit limit is
    the job's cap: a 402 from it means the cap is met, not the account's money gone."""
    billed_after_gone: bool = False
    """A request may be billed after its client is gone (OpenRouter and other hosted APIs
    finish a generation whose connection closed; vLLM and SGLang abort it): such requests are
    recorded in `outstanding` before they are sent, under budgets."""
    excluded_providers: frozenset[str] = frozenset()
    """Provider display names that only endpoints the job excludes carry: an answer naming one
    is paid for but not used (`excluded_provider`)."""
    health_url: str | None = None
    """A self-hosted server's `/health`: a server that refuses connections, drops them or
    answers 503 (loading) is drained at once and probed there until it is back."""
    outstanding: int = 0
    """Attempts that picked this endpoint and have not finished (all lanes): the pool sends
    the next one to the endpoint with the fewest, for its weight."""
    own: dict[str, int] = field(default_factory=dict)
    """Of `outstanding`, each conversation's attempts (prefix affinity does not count a
    conversation's own attempts against its server)."""
    probing: asyncio.Task[None] | None = None
    busy: BusyClock = field(default_factory=BusyClock)
    """Its busy time not yet charged to an answer (for servers priced by the hour)."""

    def took(self, conversation: str) -> None:
        """An attempt of `conversation` picked this endpoint."""
        self.outstanding += 1
        self.own[conversation] = self.own.get(conversation, 0) + 1

    def gave_back(self, conversation: str) -> None:
        """An attempt of `conversation` that `took` it has finished, however it ended."""
        self.outstanding -= 1
        left = self.own.get(conversation, 0) - 1
        if left > 0:
            self.own[conversation] = left
        else:
            self.own.pop(conversation, None)


@dataclass
class LaneRuntime:
    """A lane in this run: its settings, endpoints and one adaptive limit per endpoint."""

    name: str
    concurrency: int
    max_tokens: int
    timeouts: Timeouts
    endpoints: list[EndpointRuntime]
    datasets: list[str]
    stream: bool = False
    escalate_to: str | None = None
    limits: dict[str, AdaptiveLimit] = field(default_factory=dict)


@dataclass
class Outage:
    """An endpoint out of its pool (its server refused connections or was loading), from when
    it was drained until its health probe passed (None: still out)."""

    start: float
    """By the wall clock."""
    end: float | None = None
    resent: int = 0
    """Requests that failed on it meanwhile and went to another server (or waited for one)."""
