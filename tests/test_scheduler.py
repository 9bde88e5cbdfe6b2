from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

from regen.client import ChatClient, chat_body
from regen.config import Job, load_job
from regen.runner import ingest
from regen.scheduler import DatasetStats, RunStats, Scheduler, backoff_s
from regen.store import Store
from tests.conftest import chat_rows, write_job, write_rows
from tests.scripted_server import Reply, scripted_server


def make_job(tmp: Path, n: int, **kw: Any) -> tuple[Job, Store]:
    write_rows(tmp / "chat.jsonl", chat_rows(n))
    datasets = [("chat", "chat.jsonl", "openai")]
    job = load_job(write_job(tmp, "http://127.0.0.1:9/v1", datasets=datasets, **kw))
    store = Store.open(job.output_path)
    ingest(store, job)
    return job, store


async def run(job: Job, store: Store, url: str, sleeps: list[float] | None = None) -> RunStats:
    stats = RunStats({p.name: DatasetStats(items=p.items) for p in store.dataset_progress()})

    async def fake_sleep(s: float) -> None:
        if sleeps is not None:
            sleeps.append(s)

    async with ChatClient(
        url, "k", concurrency=job.run.concurrency, timeout_s=5, connect_timeout_s=2
    ) as c:
        sched = Scheduler(
            store,
            c,
            lambda r: chat_body(r, job.generation, job.endpoint),
            ["chat"],
            job.run,
            stats,
            sleep=fake_sleep,
            rng=random.Random(0),
            commit_interval_s=0.01,
        )
        await sched.run()
    return stats


def rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(store.path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


async def test_transient_failures_are_retried_until_done(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 1)
    replies = [
        Reply(503, {"error": {"code": 503, "message": "busy"}}, {"Retry-After": "2"}),
        Reply(500, {"error": {"code": 500, "message": "oops"}}),
        Reply(),
    ]
    sleeps: list[float] = []
    async with scripted_server(lambda n, _: replies[n]) as srv:
        stats = await run(job, store, srv.url, sleeps)
    assert stats.datasets["chat"].done == 1
    assert rows(store, "SELECT status, attempts FROM items") == [("done", 3)]
    assert rows(store, "SELECT failure_class FROM attempts ORDER BY number") == [
        ("overloaded",),
        ("server",),
        (None,),
    ]
    assert sleeps[0] >= 2.0  # Retry-After is a floor
    assert rows(store, "SELECT COUNT(*), SUM(cost_usd) FROM ledger") == [(1, 0.001)]


async def test_permanent_failures_are_stored_with_their_class(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 3)
    async with scripted_server(
        lambda n, _: Reply(400, {"error": {"code": 400, "message": "context too long"}})
    ) as srv:
        stats = await run(job, store, srv.url)
    assert len(srv.requests) == 3  # never retried
    assert stats.datasets["chat"].failed == 3
    assert rows(store, "SELECT DISTINCT status, failure_class, failure_message FROM items") == [
        ("failed", "bad_request", "context too long")
    ]
    assert rows(store, "SELECT COUNT(*) FROM results") == [(0,)]


async def test_retries_stop_at_max_attempts(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 1, extra="max_attempts = 3")
    async with scripted_server(lambda n, _: Reply(502, "bad gateway")) as srv:
        await run(job, store, srv.url)
    assert len(srv.requests) == 3
    assert rows(store, "SELECT status, failure_class, attempts FROM items") == [
        ("failed", "server", 3)
    ]


async def test_auth_failure_stops_dispatch(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 200, concurrency=4)
    async with scripted_server(
        lambda n, _: Reply(401, {"error": {"code": 401, "message": "User not found."}})
    ) as srv:
        stats = await run(job, store, srv.url)
    assert stats.stop_reason == "auth: User not found."
    assert len(srv.requests) <= 4  # at most what was in flight when the first 401 came back
    pending = rows(store, "SELECT COUNT(*) FROM items WHERE status = 'pending'")[0][0]
    assert pending >= 196
    # A rerun with a good key gets the auth-failed items back.
    assert store.requeue_retryable_failures({"auth"}) == 200 - pending


async def test_in_flight_never_exceeds_concurrency_and_all_finish(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 60, concurrency=7)
    async with scripted_server(lambda n, _: Reply(delay_s=0.02)) as srv:
        stats = await run(job, store, srv.url)
    assert srv.max_in_flight == 7
    assert stats.datasets["chat"].done == 60 and len(srv.requests) == 60
    assert rows(store, "SELECT COUNT(DISTINCT item_id) FROM results") == [(60,)]


def test_backoff_is_jittered_capped_and_floors_at_retry_after() -> None:
    rng = random.Random(3)
    waits = [backoff_s(n, None, rng) for n in range(1, 20)]
    assert all(0 <= w <= 30 for w in waits)
    assert len(set(waits)) == len(waits)
    assert backoff_s(1, 12.0, rng) == 12.0
