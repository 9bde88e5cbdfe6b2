"""Billing: what the provider says about money, and the ledger checked against it.

The ledger in state.db holds every charge regen saw. A provider also bills requests whose
answers regen never recorded: those in flight when a run was killed or cut short. OpenRouter's
`GET /key` reports the key's total usage; its growth since a job started, against the ledger's
growth over the same time, gives that difference. The same account reports the credit left
(for the credit floor), and the model's endpoint list gives prices (for dollar caps).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from regen.config import Job
from regen.engine.budget import Prices, configured_prices
from regen.engine.client.account import JsonGetter, account_credit, key_info, model_listing
from regen.engine.gate import Gate
from regen.state.db import Store

UsageReader = Callable[[], Awaitable[float | None]]
"""What an account's provider says this job's keys have used in all (None: it cannot say)."""


@dataclass(frozen=True, slots=True)
class Account:
    """Endpoints that bill one provider account: one base URL and one key variable (or one
    management key variable, whose keys the job makes for itself: `job_keys.py`). Only the
    variables' names are known here, never the keys."""

    base_url: str
    api_key_env: str
    endpoints: tuple[str, ...]
    management_key_env: str | None = None

    @property
    def key(self) -> str:
        if self.management_key_env is not None:
            return f"{self.base_url} management {self.management_key_env}"
        return f"{self.base_url} {self.api_key_env}"


def billing_accounts(job: Job) -> list[Account]:
    """The job's accounts: the endpoints whose dialect keeps one (OpenRouter's `/key` reports
    its usage)."""
    groups: dict[tuple[str, str, str | None], list[str]] = {}
    for e in job.endpoint_pool:
        if e.kind.account:
            key = (e.base_url, e.api_key_env, e.management_key_env)
            groups.setdefault(key, []).append(e.name)
    return [Account(url, env, tuple(names), manage) for (url, env, manage), names in groups.items()]


def key_usage(client: JsonGetter, gate: Gate | None = None) -> UsageReader:
    """An account read through its key's `GET /key` (usage of that key, whoever used it)."""

    async def read() -> float | None:
        info = await key_info(client, gate)
        return None if info is None else info.usage_usd

    return read


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

    RELATIVE_TOLERANCE = 1e-6
    """Float noise: a millionth of the spend (a $0.00005 answer lost from $10 still shows)."""

    def agrees(self) -> bool:
        scale = max(abs(self.provider_usd), abs(self.ledger_usd))
        return abs(self.difference_usd) <= max(1e-9, self.RELATIVE_TOLERANCE * scale)


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


async def take_baselines(
    store: Store, accounts: list[Account], usage: Mapping[str, UsageReader]
) -> dict[str, Baseline]:
    """Each account's baseline: stored by the job's first run, else read now, before any
    request of this run is sent. An account whose usage cannot be read has none."""
    out: dict[str, Baseline] = {}
    for account in accounts:
        baseline = load_baseline(store, account)
        if baseline is None:
            used = await usage[account.key]()
            if used is None:
                continue
            baseline = Baseline(used, store.spend.ledger_usd(account.endpoints))
            save_baseline(store, account, baseline)
        out[account.key] = baseline
    return out


async def reconcile_accounts(
    store: Store,
    accounts: list[Account],
    baselines: Mapping[str, Baseline],
    usage: Mapping[str, UsageReader],
    gate: Gate | None = None,
) -> list[Reconciliation]:
    """Spend since each account's baseline, by the provider and by the ledger. An account's
    usage never falls: one read below its baseline is no usage (the gate says so), and the
    account is left out, as one that cannot be read (held requests are then counted at their
    worst cases, never at what a low reading would leave them)."""
    out = []
    for account in accounts:
        baseline = baselines.get(account.key)
        used = await usage[account.key]()
        if baseline is not None and used is not None and used < baseline.provider_usd - 1e-9:
            if gate is not None:
                gate.refuse(
                    "/key",
                    "the account",
                    f"usage = {used:g} (below ${baseline.provider_usd:g}, read when the job "
                    "started: usage never falls)",
                    "the account's spend is taken as unknown",
                )
            continue
        if baseline is not None and used is not None:
            ledger = store.spend.ledger_usd(account.endpoints)
            out.append(reconcile(account, baseline, used, ledger))
    return out


async def remaining_credit(client: JsonGetter, gate: Gate | None = None) -> float | None:
    """What the account may still spend: the key's remaining limit, else the account's credit
    (`/credits`, for management keys), else None."""
    info = await key_info(client, gate)
    if info is not None and info.limit_remaining_usd is not None:
        return info.limit_remaining_usd
    return await account_credit(client, gate)


async def poll_credit(
    read: Callable[[], Awaitable[float | None]],
    interval_s: float,
    on_value: Callable[[float], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Read the remaining credit every `interval_s` until cancelled."""
    while True:
        value = await read()
        if value is not None:
            on_value(value)
        await sleep(interval_s)


async def resolve_prices(
    job: Job, clients: Mapping[str, JsonGetter], gate: Gate | None = None
) -> dict[str, Prices | None]:
    """Each endpoint's prices: from the config, else (OpenRouter) the highest valid ones among
    the model's endpoints, so that a worst case computed from them is one. A price the gate
    refuses (not a number, negative, absurd, or 0 for a paid model) is left out of that basis,
    and said once (`gate`)."""
    out: dict[str, Prices | None] = {}
    model = job.generation.model
    for e in job.endpoint_pool:
        prices = configured_prices(e)
        if prices is None and e.kind.account:
            found = await model_listing(clients[e.name], model)
            if found is not None and gate is not None:
                gate.prices(model, found, channel=f"{e.base_url}/models/{model}/endpoints")
            if found is not None and found.high is not None:
                prices = Prices(
                    *found.high,
                    floor=found.low_completion or 0.0,
                    cache_read=found.cache_read,
                    cache_write=found.cache_write,
                )
        out[e.name] = prices
    return out
