"""`regen plan`: what a job will take, before (or while) spending on it.

Reads the datasets into state.db (as a run does), optionally sends a pilot (the first N items
of each dataset in dispatch order, a seeded sample: real answers, kept for the run), then
estimates from every answer in state.db: per dataset, the items, tokens, cost and time still
to come, where budgets stop it, and which datasets the remaining credit covers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from rich.console import Console

from regen.billing import billing_accounts, remaining_credit, resolve_prices
from regen.budget import Prices
from regen.client import ChatClient
from regen.config import Job
from regen.forecast import Estimate, coverage, estimate
from regen.lock import RunLock
from regen.runner import dispatch, endpoint_keys, prepare
from regen.store import BadRowGroup, Store


@dataclass(frozen=True)
class Plan:
    """Estimates per dataset, and what the money left covers."""

    estimates: list[Estimate]
    coverage: str | None
    credit_usd: float | None
    spent_usd: float
    prices: Prices | None
    bad_reasons: list[BadRowGroup] = field(default_factory=list)
    """The commonest reasons rows were not used: (dataset, reason, rows)."""


async def _account_reads(
    job: Job, keys: dict[str, str | None]
) -> tuple[Prices | None, float | None]:
    """The highest prices of the job's endpoints and the account's remaining credit (free
    reads: no request is sent)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            e.name: await stack.enter_async_context(
                ChatClient(e.base_url, keys[e.name], concurrency=2, headers=e.headers)
            )
            for e in job.endpoint_pool
        }
        known = [p for p in (await resolve_prices(job, clients)).values() if p is not None]
        prices = (
            Prices(max(p.prompt for p in known), max(p.completion for p in known))
            if known
            else None
        )
        accounts = billing_accounts(job)
        credit = await remaining_credit(clients[accounts[0].endpoints[0]]) if accounts else None
    return prices, credit


def plan_job(job: Job, *, console: Console, api_key: str | None = None, pilot: int = 0) -> Plan:
    """Estimate the job; with `pilot`, first send up to that many items per dataset."""
    keys = endpoint_keys(job, api_key)
    with RunLock(job.output_path) as lock:
        store = Store.open(job.output_path)
        try:
            prepare(job, store, console, force=False, stale_pid=lock.stale_pid)
            if pilot > 0:
                asyncio.run(dispatch(job, store, keys, console, pilot=pilot))
            prices, credit = asyncio.run(_account_reads(job, keys))
            progress = store.dataset_progress()
            estimates = estimate(job, progress, store.dataset_samples(), prices)
            bad_reasons = store.bad_row_reasons(limit=10)
        finally:
            store.close()
    spent = sum(p.cost_usd for p in progress)
    cap = job.budget.max_cost_usd
    room = None if cap is None else max(0.0, cap - spent)
    return Plan(estimates, coverage(estimates, credit, room), credit, spent, prices, bad_reasons)
