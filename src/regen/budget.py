"""Money: what the ledger says was spent, checked against what the provider billed.

The ledger in state.db holds every charge regen saw. A provider also bills requests whose
answers regen never recorded: those in flight when a run was killed or cut short. OpenRouter's
`GET /key` reports the key's total usage; its growth since a job started, against the ledger's
growth over the same time, gives that difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from regen.config import Job
from regen.store import Store


@dataclass(frozen=True, slots=True)
class Account:
    """Endpoints that bill one provider account: one base URL and one key variable. Only the
    variable's name is known here, never the key."""

    base_url: str
    api_key_env: str
    endpoints: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.base_url} {self.api_key_env}"


def billing_accounts(job: Job) -> list[Account]:
    """The job's OpenRouter accounts (the dialect whose `/key` reports usage)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for e in job.endpoint_pool:
        if e.dialect == "openrouter":
            groups.setdefault((e.base_url, e.api_key_env), []).append(e.name)
    return [Account(url, env, tuple(names)) for (url, env), names in groups.items()]


@dataclass(frozen=True, slots=True)
class Baseline:
    """An account's usage and the ledger's total for it, read together before a job's first
    request (or the first request since reconciliation became possible)."""

    provider_usd: float
    ledger_usd: float


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Spend on one account since its baseline, as the provider and as the ledger see it."""

    account: Account
    provider_usd: float
    ledger_usd: float

    @property
    def difference_usd(self) -> float:
        """Billed but not in the ledger (positive), e.g. answers lost to a crash."""
        return self.provider_usd - self.ledger_usd

    def agrees(self, tolerance_usd: float = 5e-5) -> bool:
        return abs(self.difference_usd) < tolerance_usd


def reconcile(
    account: Account, baseline: Baseline, usage_usd: float, ledger_usd: float
) -> Reconciliation:
    """Spend since the baseline, from the account's usage and the ledger's total now."""
    return Reconciliation(
        account, usage_usd - baseline.provider_usd, ledger_usd - baseline.ledger_usd
    )


def _meta_key(account: Account) -> str:
    return f"usage_baseline {account.key}"


def load_baseline(store: Store, account: Account) -> Baseline | None:
    raw = store.get_meta(_meta_key(account))
    if raw is None:
        return None
    d = json.loads(raw)
    return Baseline(float(d["provider_usd"]), float(d["ledger_usd"]))


def save_baseline(store: Store, account: Account, baseline: Baseline) -> None:
    store.set_meta(
        _meta_key(account),
        json.dumps({"provider_usd": baseline.provider_usd, "ledger_usd": baseline.ledger_usd}),
    )
