"""The budgets a run plans before it sends: the book of every cap and token budget as the
job stands, and the keeper of the holds that earlier runs' requests still claim."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from regen.config import Job
from regen.engine.billing import (
    Account,
    Baseline,
    UsageReader,
    reconcile_accounts,
)
from regen.engine.budget import LENGTH_WINDOW, BudgetBook, Prices
from regen.engine.client import ChatClient
from regen.engine.gate import Gate
from regen.engine.holds import HoldKeeper
from regen.state.db import Store
from regen.state.work import DatasetProgress


def billed_after_gone(job: Job) -> Callable[[str | None], bool]:
    """Whether a request to an endpoint may be billed after its client is gone: hosted APIs
    finish a generation whose connection closed (OpenRouter bills it when it ends); vLLM and
    SGLang abort it. An endpoint no longer in the job is assumed to bill."""
    aborts = {e.name for e in job.endpoint_pool if e.kind.self_hosted}

    def bills(endpoint: str | None) -> bool:
        return endpoint not in aborts

    return bills


def budget_book(
    job: Job, progress: list[DatasetProgress], store: Store | None = None
) -> BudgetBook:
    """The job's budgets as they stand; with `store`, a budgeted dataset that has answers
    reserves from their lengths at once (no ramp again on a resume)."""
    recent = {
        d.name: store.answers.recent_completion_lengths(d.name, LENGTH_WINDOW)
        for d in job.datasets
        if store is not None and d.token_budget is not None
    }
    return BudgetBook(
        job.datasets,
        progress,
        job_max_cost_usd=job.budget.max_cost_usd,
        count_total=job.budget.budget_tokens == "total",
        recent_lengths=recent,
    )


def hold_keeper(
    job: Job,
    store: Store,
    book: BudgetBook,
    clients: Mapping[str, ChatClient],
    prices: Mapping[str, Prices | None],
    accounts: list[Account],
    baselines: Mapping[str, Baseline],
    usage: Mapping[str, UsageReader],
    gate: Gate | None = None,
) -> HoldKeeper:
    """The keeper of this job's held requests: it reads bills from each OpenRouter endpoint's
    `/generation` and the accounts' spend beyond the ledger. Its `settle` and `flush` are the
    scheduler's, set once the scheduler exists."""

    async def unexplained() -> dict[str, float]:
        return {
            r.account.key: r.difference_usd
            for r in await reconcile_accounts(store, accounts, baselines, usage, gate)
        }

    def nothing(*_: object) -> None:
        return None

    return HoldKeeper(
        book,
        lookup={e.name: clients[e.name] for e in job.endpoint_pool if e.kind.account},
        prices=prices,
        account_of={name: a.key for a in accounts for name in a.endpoints},
        unexplained=unexplained,
        settle=nothing,
        flush=nothing,
        gate=gate,
        max_tokens={lane.name: job.lane_max_tokens(lane) for lane in job.lane_list},
    )
