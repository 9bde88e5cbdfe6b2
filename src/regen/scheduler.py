"""Dispatch: pull pending items lazily, send them with bounded concurrency, retry by class,
commit outcomes in groups, and stop gracefully.

Only the in-flight items live in memory: a fixed pool of workers reads from a small queue that a
feeder fills from the store in dispatch order. No task is created per item.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from regen.client.errors import RETRYABLE, STOPS_RUN
from regen.config import RunConfig
from regen.conversation import Attempt, Conversation, Outcome, Request, Result
from regen.errors import EndpointError, StateError
from regen.modes import build_request
from regen.store import PendingItem, Store


class Sender(Protocol):
    async def chat(self, item_id: str, body: dict[str, Any]) -> Result: ...


@dataclass
class DatasetStats:
    """Live counters for one dataset in this run (the store holds the durable truth)."""

    items: int = 0
    done_before: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class RunStats:
    """What progress shows while a run goes on."""

    datasets: dict[str, DatasetStats]
    started_at: float = field(default_factory=time.monotonic)
    stop_reason: str | None = None

    @property
    def in_flight(self) -> int:
        return sum(d.in_flight for d in self.datasets.values())


def backoff_s(attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
    """Full-jitter exponential backoff (0.5 s doubling, capped at 30 s); Retry-After is a floor."""
    ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
    wait = rng.uniform(0, ceiling)
    return max(wait, retry_after_s or 0.0)


class Scheduler:
    """Runs every pending item of the given datasets through `sender`."""

    def __init__(
        self,
        store: Store,
        sender: Sender,
        make_body: Callable[[Request], dict[str, Any]],
        datasets: list[str],
        run: RunConfig,
        stats: RunStats,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        commit_interval_s: float = 0.2,
    ) -> None:
        self._store = store
        self._sender = sender
        self._make_body = make_body
        self._datasets = datasets
        self._run = run
        self.stats = stats
        self._sleep = sleep
        self._rng = rng or random.Random(run.shuffle_seed)
        self._commit_interval_s = commit_interval_s
        self._stopping = asyncio.Event()
        self._pending: list[Outcome] = []
        self._commit_error: StateError | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, reason: str) -> None:
        """Stop dispatching; requests in flight finish and are committed."""
        if not self._stopping.is_set():
            self.stats.stop_reason = reason
            self._stopping.set()

    async def run(self) -> None:
        queue: asyncio.Queue[PendingItem | None] = asyncio.Queue(maxsize=self._run.concurrency)
        n_workers = self._run.concurrency
        feeder = asyncio.create_task(self._feed(queue, n_workers))
        committer = asyncio.create_task(self._commit_loop())
        workers = [asyncio.create_task(self._work(queue)) for _ in range(n_workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            feeder.cancel()
            for w in workers:
                w.cancel()
            committer.cancel()
            await asyncio.gather(feeder, committer, *workers, return_exceptions=True)
            self._flush()
        if self._commit_error is not None:
            raise self._commit_error

    async def _feed(self, queue: asyncio.Queue[PendingItem | None], n_workers: int) -> None:
        batch_size = max(64, min(2 * self._run.concurrency, 4096))
        for name in self._datasets:
            after = -1
            while not self.stopping:
                batch = self._store.claim_batch(name, after, batch_size)
                if not batch:
                    break
                for item in batch:
                    if self.stopping:
                        break
                    await queue.put(item)
                after = batch[-1].order_key
        # One end marker per worker; on a stop, workers also return at their next item.
        for _ in range(n_workers):
            await queue.put(None)

    async def _work(self, queue: asyncio.Queue[PendingItem | None]) -> None:
        while True:
            item = await queue.get()
            if item is None or self.stopping:
                return
            ds = self.stats.datasets[item.dataset]
            ds.in_flight += 1
            try:
                outcome = await self._process(item)
            finally:
                ds.in_flight -= 1
            self._record(outcome)

    async def _process(self, item: PendingItem) -> Outcome:
        conv = Conversation.from_dict(item.dataset, item.row_index, item.conversation)
        req = build_request(conv, item.turn_index)
        body = self._make_body(req)
        attempts: list[Attempt] = []
        ds = self.stats.datasets[item.dataset]
        for number in range(1, self._run.max_attempts + 1):
            started, t0 = time.time(), time.monotonic()
            try:
                result = await self._sender.chat(item.id, body)
            except EndpointError as exc:
                attempts.append(
                    Attempt(
                        number,
                        started,
                        time.monotonic() - t0,
                        exc.status,
                        exc.failure_class,
                        exc.message,
                    )
                )
                ds.errors[exc.failure_class] += 1
                if exc.failure_class in STOPS_RUN:
                    self.stop(f"{exc.failure_class}: {exc.message}")
                last = number == self._run.max_attempts
                if exc.failure_class not in RETRYABLE or last or self.stopping:
                    return Outcome(
                        item.id,
                        item.dataset,
                        tuple(attempts),
                        failure_class=exc.failure_class,
                        failure_message=exc.message,
                    )
                await self._sleep(backoff_s(number, exc.retry_after_s, self._rng))
                continue
            attempts.append(
                Attempt(
                    number,
                    started,
                    result.latency_s,
                    200,
                    None,
                    None,
                    result.provider,
                    result.generation_id,
                )
            )
            return Outcome(
                item.id, item.dataset, tuple(attempts), result=replace(result, attempts=number)
            )
        raise AssertionError("unreachable: the last attempt always returns")

    def _record(self, outcome: Outcome) -> None:
        ds = self.stats.datasets[outcome.dataset]
        if outcome.result is not None:
            ds.done += 1
            u = outcome.result.usage
            ds.prompt_tokens += u.prompt_tokens
            ds.completion_tokens += u.completion_tokens
            ds.cost_usd += u.cost_usd or 0.0
        else:
            ds.failed += 1
        self._pending.append(outcome)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self._commit_interval_s)
            self._flush()

    def _flush(self) -> None:
        # Group commit: one transaction for many finished items, each complete in itself.
        if not self._pending or self._commit_error is not None:
            return
        batch, self._pending = self._pending, []
        try:
            self._store.commit_outcomes(batch)
        except StateError as exc:
            self._commit_error = exc
            self.stop(f"cannot write state: {exc}")
