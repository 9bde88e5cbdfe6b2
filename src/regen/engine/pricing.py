"""An answer's price: what the provider said passes the gate (usage it does not believe is
charged at the attempt's worst case), a server priced by the second charges its busy time, a
bill above the endpoint's prices raises them, and the prices fill in a missing cost."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from regen.conversation import Request, Result, Usage, prompt_tokens_bound
from regen.engine.attempt import Try
from regen.engine.budget import billed_above, fill_cost, remember_prices
from regen.engine.client.response import counted_usage
from regen.engine.gate import BILL_CEILING, PROMPT_SLACK, Asked, believed
from regen.engine.runtime import EndpointRuntime, LaneRuntime
from regen.state.db import Store
from regen.state.work import PendingItem

if TYPE_CHECKING:
    from regen.engine.stats import RunStats


class Pricing:
    """Prices a run's answers against its statistics (the gate, the prices learned)."""

    def __init__(self, stats: RunStats, store: Store) -> None:
        self._stats = stats
        self._store = store

    def price(
        self,
        ep: EndpointRuntime,
        item: PendingItem,
        result: Result,
        lane: LaneRuntime,
        req: Request,
        att: Try,
    ) -> Result:
        """An answer with its usage counted and its cost filled in. What the provider said
        passes the gate first: usage it does not believe is charged at the attempt's worst
        case (the answer is kept, flagged). Then a server priced by the second charges its
        busy time; otherwise the bill stands (and raises the endpoint's prices when above
        them), or the prices give the cost."""
        result = counted_usage(result, item.prompt_tokens_est)
        usage = self._gate(ep, result, lane, req, att)
        if ep.prices is not None and ep.prices.usd_per_s:
            busy_s = ep.busy.take(time.monotonic())
            usage = replace(usage, cost_usd=busy_s * ep.prices.usd_per_s)
        elif believed(usage):
            self._learn_price(ep, usage)
        usage = fill_cost(usage, ep.prices)
        if usage is not result.usage:  # a Result's copy costs a few us: only if new
            result = replace(result, usage=usage)
        return result

    def _gate(
        self, ep: EndpointRuntime, result: Result, lane: LaneRuntime, req: Request, att: Try
    ) -> Usage:
        """The answer's usage if the gate believes it, else its worst case: at most max_tokens
        written, a prompt within its bound, a bill within BILL_CEILING x the attempt's worst
        case and above BILL_FLOOR x its completion at the lowest listed price."""
        prices, usage = ep.prices, result.usage
        # The prompt's bound costs a pass over the prompt: taken only when a count needs it
        # (a prompt within the slack's tokens passes whatever the bound; a junk count is
        # charged the bound), or for the worst case of a bill on a lease-free attempt.
        needs_bound = bool(usage.junk) or usage.prompt_tokens > PROMPT_SLACK[1]
        bound = prompt_tokens_bound(req) if needs_bound else None
        worst: float | None = None
        if att.lease is not None and att.lease.worst_usd > 0:
            worst = att.lease.worst_usd
        elif prices is not None and not prices.usd_per_s and usage.cost_usd is not None:
            worst = prices.cost(bound or prompt_tokens_bound(req), lane.max_tokens)
        asked = Asked(
            max_tokens=lane.max_tokens,
            prompt_bound=bound,
            worst_usd=worst,
            floor_usd_per_token=prices.floor if prices is not None else None,
        )
        who = (
            f"{result.provider} (endpoint {ep.name})" if result.provider else f"endpoint {ep.name}"
        )
        return self._stats.gate.usage(usage, asked, channel="an answer", who=who)

    def _learn_price(self, ep: EndpointRuntime, usage: Usage) -> None:
        """Raise the endpoint's prices when an answer was billed more than they say it costs (a
        price list gone stale, or prices in the job file below the provider's): a dollar cap's
        worst cases must not be below what requests really cost."""
        factor = billed_above(ep.prices, usage)
        if ep.prices is None or factor is None:
            return
        before = self._stats.repriced.get(ep.name, 1.0)
        total = min(BILL_CEILING, before * factor)  # a bill above it is not believed
        if total <= before:
            return
        ep.prices = ep.prices.scaled(total / before)
        self._stats.repriced[ep.name] = total
        remember_prices(self._store, ep.name, ep.prices.scaled(1 / total), total)
