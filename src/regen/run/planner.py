"""`regen plan`: what a job will take, before (or while) spending on it.

Reads the datasets into state.db (as a run does), optionally sends a pilot (the first N items
of each dataset in dispatch order, a seeded sample: real answers, kept for the run; with
--precision, as many as the estimates need: regen.run.pilot), then estimates from every answer
in state.db: per dataset, the items, tokens, cost and time still to come, where budgets stop
it, and which datasets the remaining credit covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from regen.config import Job
from regen.engine.billing import billing_accounts, remaining_credit, resolve_prices
from regen.engine.budget import Prices
from regen.engine.client import ChatClient
from regen.lock import RunLock
from regen.run.accounts import check_reachable, endpoint_keys
from regen.run.caching import flow_caches
from regen.run.dispatch import dispatch
from regen.run.forecast import CacheSaving, JobPlan, coverage, plan, worst_cases
from regen.run.pilot import (
    TIME_UP,
    Bounds,
    CapLeaves,
    Limits,
    Quantity,
    Sent,
    bounded,
    run_pilot,
)
from regen.run.prepare import prepare
from regen.state.db import Store
from regen.state.sources import BadRowGroup
from regen.state.work import DatasetProgress
from regen.view.progress import Shown


@dataclass(frozen=True)
class Plan:
    """Estimates per dataset, and what the money left covers."""

    job: JobPlan
    coverage: str | None
    credit_usd: float | None
    spent_usd: float
    prices: Prices | None
    bad_reasons: list[BadRowGroup] = field(default_factory=list)
    """The commonest reasons rows were not used: (dataset, reason, rows)."""
    pilot: list[Quantity] = field(default_factory=list)
    """How well the pilot measured each total the plan sums (empty without a pilot)."""
    pilot_notes: list[str] = field(default_factory=list)
    """The pilot's closing lines: which bound ended it, what it left wider than asked."""


async def _account_reads(
    job: Job, keys: dict[str, str | None]
) -> tuple[Prices | None, float | None]:
    """The highest prices of the job's endpoints and the account's remaining credit (free
    reads: no request is sent)."""
    await check_reachable(job)
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            e.name: await stack.enter_async_context(
                ChatClient(
                    e.base_url,
                    keys[e.name],
                    concurrency=2,
                    headers=e.headers,
                    follow_redirects_to=e.follow_redirects_to,
                )
            )
            for e in job.endpoint_pool
        }
        known = [p for p in (await resolve_prices(job, clients)).values() if p is not None]
        prices = highest(known) if known else None
        accounts = billing_accounts(job)
        credit = await remaining_credit(clients[accounts[0].endpoints[0]]) if accounts else None
    return prices, credit


def highest(known: list[Prices]) -> Prices:
    """The highest of the endpoints' prices; a cache read price only where every endpoint
    lists one (a request may go to any of them: no discount one does not list)."""
    reads = [p.cache_read for p in known]
    writes = [p.cache_write for p in known if p.cache_write is not None]
    return Prices(
        max(p.prompt for p in known),
        max(p.completion for p in known),
        cache_read=None if None in reads else max(r for r in reads if r is not None),
        cache_write=max(writes) if writes else None,
    )


def _send_pilot(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    shown: Shown,
    want: dict[str, int],
    limits: Limits,
) -> Sent:
    """One pilot round: dispatch until each dataset has `want` items finished or `limits`
    stop it, and say how the round ended."""
    stats = asyncio.run(
        dispatch(
            bounded(job, limits),
            store,
            keys,
            shown,
            pilot=want,
            stop_at=(limits.stop_at, TIME_UP),
            as_filed=job,
        )
    ).stats
    return Sent(stats.stop_reason, stats.budget_stop)


def _estimate(
    job: Job,
    store: Store,
    progress: list[DatasetProgress],
    prices: Prices | None,
    credit: float | None,
) -> JobPlan:
    """The forecast from what the store holds now, within the credit the account has left
    above the job's credit floor."""
    floor = job.budget.stop_when_credits_below
    credit_room = None if credit is None else credit - (floor or 0.0)
    return plan(
        job,
        progress,
        store.spend.flow_entries(),
        {lane.name: store.spend.answer_latencies(lane.name) for lane in job.lane_list},
        store.work.pending_flows(),
        prices,
        store.runs.lane_capacity(),
        credit_room,
        caching=flow_caches(store.work.prompt_shapes(), store.spend.cache_use()),
        censored=store.outstanding.cut_short(),
    )


def _cap_leaves(
    job: Job, store: Store, prices: Prices | None, credit: float | None
) -> Callable[[], CapLeaves | None] | None:
    """What the plan says the job's cap (or the account's credit, read before the pilot and
    less what the pilot has spent since) leaves unsent, as the store stands when called (None:
    the room is expected to last): a pilot measures that count too. None without a cap or a
    credit reading: no room to run out, no plan to make each round."""
    if job.budget.max_cost_usd is None and credit is None:
        return None
    spent_at_read = sum(p.cost_usd for p in store.work.dataset_progress())

    def leaves() -> CapLeaves | None:
        progress = store.work.dataset_progress()
        spent = sum(p.cost_usd for p in progress)
        left = None if credit is None else credit - (spent - spent_at_read)
        estimate = _estimate(job, store, progress, prices, left)
        if estimate.unsent_sd is None:
            return None
        return CapLeaves(estimate.unsent, estimate.unsent_sd)

    return leaves


def _with_worst(job: Job, store: Store, prices: Prices | None, bounds: Bounds) -> Bounds:
    """The pilot's bounds with what admission reserves for one request of the lanes that
    have items of their own (the cheapest of them), and the requests those lanes keep on the
    wire."""
    pending = store.work.pending_flows()
    worst = worst_cases(job, pending, prices)
    own = [lane for lane in job.lane_list if any(k[0] == lane.name for k in pending)]
    if worst is None or not own:
        return bounds
    return replace(
        bounds,
        worst_usd=min(worst[lane.name] for lane in own),
        at_once=sum(lane.concurrency for lane in own),
    )


def plan_job(
    job: Job,
    *,
    shown: Shown = None,
    api_key: str | None = None,
    pilot: int = 0,
    precision: float | None = None,
    bounds: Bounds | None = None,
) -> Plan:
    """Estimate the job; with `pilot`, first send up to that many items per dataset (with
    `precision`, only as many as it takes to know each lane's time and the job's cost over the
    items to come within +/-precision: regen.run.pilot), within `bounds` (time, money, a share
    of each token budget; the defaults without). What it says goes out as events
    (`regen/events.py`); `shown` is how a pilot's progress is shown (view/progress.py's Watch;
    nowhere without one)."""
    keys = endpoint_keys(job, api_key)
    with RunLock(job.output_path) as lock:
        store = Store.open(job.output_path)
        try:
            prepare(job, store, force=False, stale_pid=lock.stale_pid)
            pilot_errors: list[Quantity] = []
            pilot_notes: list[str] = []
            if pilot > 0:
                send = functools.partial(_send_pilot, job, store, keys, shown)
                read = asyncio.run(_account_reads(job, keys))
                leaves = _cap_leaves(job, store, *read)
                bounds = _with_worst(job, store, read[0], bounds or Bounds())
                outcome = run_pilot(job, store, pilot, precision, send, bounds, leaves)
                pilot_errors, pilot_notes = outcome.quantities, outcome.notes
            prices, credit = asyncio.run(_account_reads(job, keys))
            progress = store.work.dataset_progress()
            spent = sum(p.cost_usd for p in progress)
            estimate = _estimate(job, store, progress, prices, credit)
            bad_reasons = store.sources.bad_row_reasons(limit=10)
            _, held_usd, _ = store.outstanding.held()
        finally:
            store.close()
    cap = job.budget.max_cost_usd
    # Requests of killed runs whose bills are not known yet may still take their worst case.
    room = None if cap is None else max(0.0, cap - spent - held_usd)
    return Plan(
        estimate,
        coverage(estimate.datasets, credit, room),
        credit,
        spent,
        prices,
        bad_reasons,
        pilot_errors,
        pilot_notes,
    )


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as data (`regen plan --json`, and what view/plan.py draws): its rows, the
    job's totals and the pilot's measures."""
    return {
        "datasets": [asdict(d) for d in plan.job.datasets],
        "lanes": [asdict(lane) for lane in plan.job.lanes],
        "flows": [asdict(f) for f in plan.job.flows],
        "job": {
            "cost_usd": plan.job.cost_usd and asdict(plan.job.cost_usd),
            "time_s": plan.job.time_s and asdict(plan.job.time_s),
            "stop": plan.job.stop,
            "kill_margin_usd": plan.job.kill_margin_usd,
            "repay_usd": plan.job.repay_usd,
            "unsent": plan.job.unsent,
            "caching": plan.job.caching and asdict(plan.job.caching),
            "assumptions": plan.job.assumptions,
        },
        "bad_row_reasons": [asdict(g) for g in plan.bad_reasons],
        "coverage": plan.coverage,
        "credit_usd": plan.credit_usd,
        "spent_usd": plan.spent_usd,
        "pilot": [asdict(q) for q in plan.pilot],
        "pilot_notes": plan.pilot_notes,
    }


def verdict_lines(p: JobPlan) -> list[str]:
    """What the plan's verdict rests on beyond the expected cost: the kill margin and the
    escalation re-pay."""
    out = []
    if p.kill_margin_usd is not None:
        out.append(
            f"kill margin: ${p.kill_margin_usd:.2f}, what a run killed with every lane full may "
            "leave in flight to be billed (each lane's concurrency at max_tokens and its prompts' "
            "bound, at the highest prices)"
        )
    if p.caching is not None:
        out.append(cache_line(p.caching))
    if p.repay_usd:
        out.append(
            f"escalation re-pay: ${p.repay_usd:.2f} of the expected cost pays first tries cut at "
            "max_tokens, whose items are paid again on a longer lane"
        )
    return out


def cache_line(c: CacheSaving) -> str:
    """The verdict's line on the provider's prompt cache: every item to come with it and
    without it, and the saving (none where no cache read price is listed)."""
    if not c.listed:
        return (
            f"prompt cache: no saving expected (${c.without_usd:.4f} for every item to come): "
            "the endpoint lists no cache read price, so every prompt token is priced in full"
        )
    return (
        f"prompt cache: ${c.with_usd:.4f} expected for every item to come with it, "
        f"${c.without_usd:.4f} without: it saves ${c.saved_usd:.4f} "
        f"({c.share:.0%} of the prompt tokens read from cache at the listed price, if each "
        "conversation's turns reach the provider within its cache's lifetime; the caps' worst "
        "cases and the kill margin take no discount)"
    )
