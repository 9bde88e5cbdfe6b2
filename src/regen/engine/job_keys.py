"""Keys a job makes for itself with an OpenRouter management key, so that the provider enforces
the job's cap and the key's usage is the job's own spend.

Each run creates a key whose credit limit is what the job's cap still allows (less what the
requests of killed runs may still be billed), runs on it, and disables it when it ends. The
key's secret lives in this process only: it is never written anywhere, so a killed run's key
cannot be used again, and the next run disables it (its usage stays readable) and makes its
own. The keys' hashes (not secrets) are kept in state.db's meta, so that their usage can be
read and, when the job is done, the keys deleted.

How OpenRouter enforces a key's limit (its documentation, 2026): it checks a request when it
starts, against the usage already billed, and refuses it (402) when the limit left cannot pay
for its prompt and max_tokens; it bills a request when its generation ends. Requests running
when the limit is reached are not stopped, so a key's usage can end above its limit by what
the requests then in flight cost: at most their worst cases. regen's own admission keeps that
from happening in a live run (it never has more in flight than the cap allows); across kills
the next key's limit leaves out the killed runs' requests in flight.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass

from regen.engine.client.keys import KeyApi, KeyApiError
from regen.errors import ConfigError
from regen.safe import register_secret
from regen.state.db import Store

JOB_KEYS_META = "job_keys"


@dataclass
class JobKey:
    """A key the job made (its hash, never its secret) and what it had used when last read."""

    hash: str
    name: str
    account: str
    created_at: float
    usage_usd: float = 0.0
    deleted: bool = False


class JobKeys:
    """The keys of one account that this job made, and the one this run uses."""

    def __init__(self, store: Store, api: KeyApi, account: str, management_key_env: str) -> None:
        self._store = store
        self._api = api
        self._account = account
        self._env = management_key_env
        raw = store.get_meta(JOB_KEYS_META)
        self._all = [JobKey(**k) for k in json.loads(raw)] if raw else []
        self.current: JobKey | None = None
        self.limit_usd: float | None = None
        self.freed = 0.0
        """The room freed by killed runs' requests that the key's limit has been raised by."""

    @property
    def keys(self) -> list[JobKey]:
        return [k for k in self._all if k.account == self._account]

    def _save(self) -> None:
        self._store.set_meta(JOB_KEYS_META, json.dumps([asdict(k) for k in self._all]))

    def _refused(self, exc: KeyApiError) -> ConfigError:
        return ConfigError(
            f"the management key in {self._env} was refused ({exc}): it must be an OpenRouter "
            "management key (openrouter.ai/settings/management-keys); or remove "
            "[endpoint].management_key_env to run on the key in api_key_env"
        )

    async def disable_earlier(self) -> float:
        """Disable the job's earlier keys (a killed run's is left enabled): what they have
        used in all, as OpenRouter reports it."""
        for k in self.keys:
            if k.deleted:
                continue
            try:
                record = await self._api.get(k.hash)
                if record.usage_usd is not None:  # junk: the last usage read stands
                    k.usage_usd = record.usage_usd
                if not record.disabled:
                    await self._api.update(k.hash, disabled=True)
            except KeyApiError as exc:
                if exc.status == 404:  # deleted by hand: its last usage read stands
                    k.deleted = True
                    continue
                raise self._refused(exc) from exc
        return sum(k.usage_usd for k in self.keys)

    async def start(self, name: str, limit_usd: float | None) -> str:
        """Make this run's key, with this credit limit: its secret, to send requests with."""
        try:
            record, secret = await self._api.create(
                name, None if limit_usd is None else max(0.0, limit_usd)
            )
        except KeyApiError as exc:
            raise self._refused(exc) from exc
        self.current = JobKey(record.hash, record.name, self._account, time.time())
        self.limit_usd = record.limit_usd
        self._all.append(self.current)
        self._save()  # before the first request: a kill leaves the key known, to disable
        register_secret(secret)
        return secret

    async def usage(self) -> float | None:
        """What the job's keys of this account have used, as OpenRouter reports it (None when
        it cannot be read)."""
        total = 0.0
        for k in self.keys:
            if k.deleted:
                total += k.usage_usd
                continue
            try:
                used = (await self._api.get(k.hash)).usage_usd
            except KeyApiError as exc:
                if exc.status != 404:
                    return None
                k.deleted = True
            else:
                if used is None:  # no amount: the account's usage is not known now
                    return None
                k.usage_usd = used
            total += k.usage_usd
        return total

    async def credit(self) -> float | None:
        """The account's remaining credit (`/credits`, which a management key may read)."""
        return await self._api.credit()

    async def set_limit(self, limit_usd: float) -> bool:
        """Let this run's key spend up to `limit_usd` (requests of killed runs were billed less
        than their worst cases, or more). True when the key's limit is that now."""
        if self.current is None:
            return False
        limit = max(0.0, limit_usd)
        if self.limit_usd is not None and abs(limit - self.limit_usd) < 1e-9:
            return True
        try:
            record = await self._api.update(self.current.hash, limit=limit)
        except KeyApiError:
            return False  # the run's own admission still holds the cap; the next tick retries
        self.limit_usd = record.limit_usd
        return True

    async def end(self, *, job_done: bool) -> None:
        """Disable this run's key; when the job is done, delete all of its keys, their final
        usage kept in state.db."""
        if self.current is not None:
            # If this fails, the secret dies with this process all the same, and the next run
            # disables the key.
            with contextlib.suppress(KeyApiError):
                await self._api.update(self.current.hash, disabled=True)
        if job_done:
            for k in self.keys:
                if k.deleted:
                    continue
                try:
                    used = (await self._api.get(k.hash)).usage_usd
                    if used is not None:
                        k.usage_usd = used
                    await self._api.delete(k.hash)
                    k.deleted = True
                except KeyApiError:
                    continue
        self._save()
