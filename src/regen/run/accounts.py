"""Who pays and how much is left: the endpoints' keys (from the environment, or made for
the run with a management key), reachability, credit, and the run's key's limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from regen.config import EndpointConfig, Job, key_from_env
from regen.engine.billing import (
    Account,
    poll_credit,
    remaining_credit,
)
from regen.engine.client import ChatClient
from regen.engine.gate import BILL_CEILING, Gate
from regen.engine.holds import HoldKeeper
from regen.engine.job_keys import JobKeys
from regen.engine.scheduler import Scheduler
from regen.engine.stats import RunStats
from regen.errors import ConfigError
from regen.safe import register_secret
from regen.state.db import Store
from regen.state.work import DatasetProgress


def api_key_from_env(endpoint: EndpointConfig) -> str | None:
    """The key from the variable that the endpoint names; self-hosted servers may need none,
    and an endpoint with a management key gets a key made for the run instead (`job_keys`)."""
    if endpoint.management_key_env is not None:
        management_key(endpoint.management_key_env)  # said now, before anything is read
        return None
    name = endpoint.api_key_env
    key = key_from_env(name, "api_key_env")
    register_secret(key)
    if not key and not endpoint.kind.self_hosted:
        raise ConfigError(f"set {name} or name another variable in [endpoint].api_key_env")
    return key or None


def management_key(env: str) -> str:
    key = key_from_env(env, "management_key_env")
    if not key:
        raise ConfigError(f"set {env} or name another variable in [endpoint].management_key_env")
    register_secret(key)
    return key


def endpoint_keys(job: Job, api_key: str | None = None) -> dict[str, str | None]:
    """Each endpoint's key: `api_key` when given, else its environment variable."""
    return {
        e.name: api_key if api_key is not None else api_key_from_env(e) for e in job.endpoint_pool
    }


async def check_reachable(job: Job) -> None:
    """The first error is the real one: a hosted endpoint that cannot be reached is said so
    before its keys, prices, credit or routes are read (each would fail in its own terms: a
    cap "needs prices", a floor "cannot be read"). Self-hosted servers may still be loading:
    their requests wait for their /health instead (`[run] pool_down_timeout_s`)."""
    for e in job.endpoint_pool:
        if e.kind.self_hosted:
            continue
        async with ChatClient(
            e.base_url,
            None,
            concurrency=1,
            headers=e.headers,
            follow_redirects_to=e.follow_redirects_to,
        ) as probe:
            why = await probe.reach()
        if why is not None:
            raise ConfigError(
                f"endpoint {e.name}: {e.base_url} cannot be reached: {why} (is [endpoint]."
                "base_url right, and the network up?)"
            )


def credit_reader(
    account: Account,
    clients: Mapping[str, ChatClient],
    job_keys: Mapping[str, JobKeys],
    gate: Gate | None = None,
) -> Callable[[], Awaitable[float | None]]:
    """How to read what an account may still spend: its key's remaining limit, else the
    account's credit; with a management key, the account's credit (`/credits`: the run's own
    key's limit is the job's cap, not the account's money)."""
    made = job_keys.get(account.key)
    if made is not None:
        return made.credit
    client = clients[account.endpoints[0]]
    return lambda: remaining_credit(client, gate)


async def check_credit_floor(
    job: Job,
    accounts: list[Account],
    credit: Mapping[str, Callable[[], Awaitable[float | None]]],
) -> None:
    """A credit floor that could never fire is refused before anything is sent."""
    floor = job.budget.stop_when_credits_below
    if floor is None:
        return
    if not accounts:
        raise ConfigError(
            "[budget].stop_when_credits_below reads an OpenRouter account's credit, and no "
            "endpoint of this job is OpenRouter: remove it (cap the spend with "
            "[budget].max_cost_usd)"
        )
    for account in accounts:
        if await credit[account.key]() is None:
            raise ConfigError(
                f"[budget].stop_when_credits_below = {floor:g} cannot work: the credit of the "
                f"key in {account.api_key_env} cannot be read ({account.base_url}/key shows no "
                "limit, and /credits needs a management key). Give the key a credit limit "
                "(openrouter.ai/settings/keys), or remove the floor and cap the job with "
                "[budget].max_cost_usd"
            )


async def watch_credit(
    job: Job,
    accounts: list[Account],
    credit: Mapping[str, Callable[[], Awaitable[float | None]]],
    scheduler: Scheduler,
    stats: RunStats,
) -> None:
    """Keep the account's remaining credit in the stats; stop below the credit floor."""
    if not accounts:
        return
    floor = job.budget.stop_when_credits_below

    def seen(value: float) -> None:
        stats.credits_usd = value
        if floor is not None and value < floor:
            scheduler.stop(
                f"the account's credit (${value:.4f}) is below "
                f"[budget].stop_when_credits_below = {floor:g}",
                budget=True,
            )

    await poll_credit(credit[accounts[0].key], job.budget.credit_poll_s, seen)


def key_limit(
    job: Job,
    progress: list[DatasetProgress],
    store: Store,
    keys_used_usd: float,
    gate: Gate | None = None,
) -> float | None:
    """The credit limit of a key made for this run: what the job's cap still allows after
    the spend so far (the ledger's, or what the job's earlier keys have used as OpenRouter
    says, whichever is more) and what requests of killed runs may still be billed (None: no
    cap). The earlier keys had limits within the cap: a usage above BILL_CEILING x the cap is
    no usage of theirs (a lie would block the job for good), and the ledger stands."""
    cap = job.budget.max_cost_usd
    if cap is None:
        return None
    if keys_used_usd > BILL_CEILING * cap:
        if gate is not None:
            gate.refuse(
                "/keys",
                "the account",
                f"usage = {keys_used_usd:g} for the job's earlier keys (their limits were "
                f"within the cap, ${cap:g})",
                "the ledger's spend is used",
            )
        keys_used_usd = 0.0
    _, held_usd, _ = store.outstanding.held()
    # What the job's earlier requests will have cost: at most the ledger and their holds'
    # worst cases; at least what the earlier keys were billed already (more, if the ledger
    # missed something).
    spent = max(sum(p.cost_usd for p in progress) + held_usd, keys_used_usd)
    return max(0.0, cap - spent)


def key_name(job: Job) -> str:
    """A made key's name: the job, its output directory and when, to find it by in the
    account's key list."""
    return (
        f"regen {job.job.name} {job.output_path.name} "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}Z"
    )


async def follow_key_limit(
    made: JobKeys, start_usd: float | None, keeper: HoldKeeper, every_s: float = 2.0
) -> None:
    """Keep the run's key's limit at what the cap allows as requests of killed runs are
    billed: raised by what they cost less than their worst cases (each freed dollar is the
    job's to spend again), lowered by what they cost more (prices gone stale), until
    cancelled."""
    if start_usd is None:
        return
    while True:
        await asyncio.sleep(every_s)
        freed, lagging = keeper.freed_earlier_usd, keeper.lagging_usd
        if await made.set_limit(start_usd + freed):
            # The book counted that room as not the job's until OpenRouter's limit had it too.
            keeper.book.key_caught_up(lagging - made.freed)
            made.freed = lagging
