from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from regen.config import Job, load_job
from regen.engine.attempt import backoff_s
from regen.engine.client import ChatClient
from regen.engine.runtime import Sender
from regen.engine.scheduler import Scheduler
from regen.engine.stats import DatasetStats, RunStats
from regen.run.lanes import build_lanes
from regen.sources.ingest import ingest, lane_rules
from regen.state.db import Store
from tests.conftest import chat_rows, write_job, write_rows
from tests.scripted_server import Reply, Scripted, scripted_server


def make_job(tmp: Path, n: int, extra: str = "", **kw: Any) -> tuple[Job, Store]:
    write_rows(tmp / "chat.jsonl", chat_rows(n))
    datasets = [("chat", "chat.jsonl", "openai")]
    job = load_job(write_job(tmp, "http://127.0.0.1:9/v1", datasets=datasets, extra=extra, **kw))
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))
    return job, store


async def run_with(
    job: Job,
    store: Store,
    senders: Mapping[str, Sender],
    sleeps: list[float] | None = None,
    until: Callable[[Scheduler], bool] | None = None,
    sequential: list[str] | None = None,
) -> tuple[RunStats, Scheduler]:
    stats = RunStats({p.name: DatasetStats(items=p.items) for p in store.work.dataset_progress()})

    async def fake_sleep(s: float) -> None:
        if sleeps is not None:
            sleeps.append(s)

    sched = Scheduler(
        store,
        build_lanes(job, senders),
        job.run,
        stats,
        sleep=fake_sleep,
        rng=random.Random(0),
        commit_interval_s=0.01,
        sequential=sequential or (),
    )
    await sched.run()
    return stats, sched


async def run(job: Job, store: Store, url: str, sleeps: list[float] | None = None) -> RunStats:
    async with ChatClient(url, "k", concurrency=64) as c:
        stats, _ = await run_with(job, store, {e.name: c for e in job.endpoint_pool}, sleeps)
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
    job, store = make_job(tmp_path, 4, extra="stop_error_rate = 1.0", concurrency=1)
    too_long = Reply(400, {"error": {"code": 400, "message": "context too long"}})
    # One answer among them: the error is the items' own, not one every request gets.
    async with scripted_server(lambda n, _: Reply() if n == 1 else too_long) as srv:
        stats = await run(job, store, srv.url)
    assert len(srv.requests) == 4  # never retried
    assert stats.datasets["chat"].failed == 3
    assert rows(
        store,
        "SELECT status, failure_class, failure_message, COUNT(*) FROM items "
        "GROUP BY 1, 2, 3 ORDER BY 1",
    ) == [
        ("done", None, None, 1),
        ("failed", "bad_request", "context too long", 3),
    ]
    assert rows(store, "SELECT COUNT(*) FROM results") == [(1,)]


async def test_client_errors_of_some_items_that_come_back_first_fail_only_them(
    tmp_path: Path,
) -> None:
    """Errors come back in milliseconds and answers in seconds: the first outcomes of a run
    can all be the same 400 of a few items whose prompts are too long. The requests sent with
    them are still being answered, so the error is theirs: they fail, the rest are answered."""
    job, store = make_job(tmp_path, 40, extra="stop_error_rate = 1.0", concurrency=8)
    too_long = Reply(400, {"error": {"code": 400, "message": "maximum context length is 8192"}})

    def script(n: int, body: dict[str, Any]) -> Reply:
        number = int(body["messages"][-1]["content"].split()[2].rstrip(":"))
        return too_long if number % 4 == 0 else Reply(delay_s=1.5)

    async with scripted_server(script) as srv:
        stats = await run(job, store, srv.url)
    assert stats.stop_reason is None
    assert rows(store, "SELECT status, COUNT(*) FROM items GROUP BY 1 ORDER BY 1") == [
        ("done", 30),
        ("failed", 10),
    ]


async def test_a_client_error_that_every_request_gets_leaves_the_items_pending(
    tmp_path: Path,
) -> None:
    """The same 400 for every item, none answered: it is the job's error (a model name the
    server does not know), not theirs. The run stops with the server's message and the items
    stay pending, for the fixed job to send."""
    job, store = make_job(tmp_path, 30, extra="stop_error_rate = 1.0", concurrency=4)
    unknown = Reply(
        400, {"error": {"code": 400, "message": "no/such-model is not a valid model ID"}}
    )
    async with scripted_server(lambda n, _: unknown) as srv:
        stats = await run(job, store, srv.url)
    assert stats.stop_reason is not None
    assert stats.stop_reason.startswith(
        "every request fails with the same error: no/such-model is not a valid model ID"
    )
    assert rows(store, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("pending", 30)]
    assert stats.datasets["chat"].failed == 0


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
    assert store.work.requeue_retryable_failures({"auth"}) == 200 - pending


async def test_in_flight_never_exceeds_concurrency_and_all_finish(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 60, concurrency=7)
    async with scripted_server(lambda n, _: Reply(delay_s=0.02)) as srv:
        stats = await run(job, store, srv.url)
    assert srv.max_in_flight == 7
    assert stats.datasets["chat"].done == 60 and len(srv.requests) == 60
    assert rows(store, "SELECT COUNT(DISTINCT item_id) FROM results") == [(60,)]


async def test_the_limit_backs_off_on_429_and_the_run_completes(tmp_path: Path) -> None:
    # A provider that takes 5 at once and answers 429 above that; the lane allows 50.
    job, store = make_job(tmp_path, 150, concurrency=50, extra="initial_limit = 50")
    state: dict[str, Scripted] = {}

    def script(n: int, _: dict[str, Any]) -> Reply:
        if state["srv"].in_flight > 5:
            return Reply(429, {"error": {"code": 429, "message": "full"}})
        return Reply(delay_s=0.01)

    async with scripted_server(script) as srv:
        state["srv"] = srv
        stats = await run(job, store, srv.url)
    assert stats.datasets["chat"].done == 150
    (limit,) = stats.lanes["default"].limits
    assert limit.overloads > 0 and limit.current < 50
    assert stats.datasets["chat"].errors["rate_limited"] == limit.overloads


async def test_stop_error_rate_ignores_rate_limits(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 40, concurrency=1)
    async with scripted_server(
        lambda n, _: Reply(429, {"error": {"code": 429, "message": "x"}}) if n % 2 else Reply()
    ) as srv:
        stats = await run(job, store, srv.url)
    assert stats.stop_reason is None and stats.datasets["chat"].done == 40


async def test_escalation_resends_a_truncated_answer_on_the_long_lane(tmp_path: Path) -> None:
    lanes = """
[[lanes]]
name = "short"
concurrency = 4
max_tokens = 100
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 2
max_tokens = 1000
"""
    job_file = write_job(tmp_path, "http://127.0.0.1:9/v1", rows=10)
    job_file.write_text(job_file.read_text().replace("[[datasets]]", lanes + "\n[[datasets]]", 1))
    job = load_job(job_file)
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))

    def script(n: int, body: dict[str, Any]) -> Reply:
        if body["max_tokens"] == 100 and "number 3:" in body["messages"][0]["content"]:
            truncated = {
                "choices": [{"finish_reason": "length", "message": {"content": "cut"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 100, "cost": 0.01},
            }
            return Reply(body=truncated)
        return Reply()

    async with scripted_server(script) as srv, ChatClient(srv.url, "k", concurrency=8) as c:
        stats, _ = await run_with(job, store, {"default": c})
    assert stats.datasets["chat"].done == 10
    assert stats.lanes["short"].escalated == 1 and stats.lanes["long"].done == 1
    assert sorted(b["max_tokens"] for b in srv.requests) == [100] * 10 + [1000]
    assert rows(store, "SELECT kind, cost_usd FROM ledger WHERE kind = 'escalated'") == [
        ("escalated", 0.01)
    ]
    ((n, total),) = rows(store, "SELECT COUNT(*), SUM(cost_usd) FROM ledger")
    assert n == 11 and abs(total - (0.01 + 10 * 0.001)) < 1e-12


class Flaky:
    """A sender that always fails with a connection error, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, item_id: str, body: dict[str, Any], **kw: Any) -> Any:
        from regen.errors import EndpointError

        self.calls += 1
        raise EndpointError("connection", "refused")


async def test_an_unhealthy_endpoint_is_cooled_down(tmp_path: Path) -> None:
    endpoints = """
[[endpoints]]
name = "bad"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "X"

[[endpoints]]
name = "good"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "X"
"""
    job_file = write_job(tmp_path, "http://x", rows=100, concurrency=1)
    text = job_file.read_text()
    text = text[: text.index("[endpoint]")] + endpoints + text[text.index("[generation]") :]
    job_file.write_text(text)
    job = load_job(job_file)
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))
    bad = Flaky()
    async with (
        scripted_server(lambda n, _: Reply()) as srv,
        ChatClient(srv.url, "k", concurrency=2) as good,
    ):
        stats, _ = await run_with(job, store, {"bad": bad, "good": good})
    assert stats.datasets["chat"].done == 100
    assert 3 <= bad.calls <= 6  # three in a row cool it down for the rest of this short run


class Slow:
    """A sender that answers after `delay_s`."""

    def __init__(self, delay_s: float, busy_at: int) -> None:
        self.delay_s = delay_s
        self.started = 0
        self.busy_at = busy_at
        self.busy = asyncio.Event()
        """Set once `busy_at` requests have started: the moment a test acts on."""

    async def chat(self, item_id: str, body: dict[str, Any], **kw: Any) -> Any:
        from regen.conversation import Message, Result, Usage

        self.started += 1
        if self.started >= self.busy_at:
            self.busy.set()
        await asyncio.sleep(self.delay_s)
        return Result(item_id, Message("assistant", "ok"), "stop", Usage(1, 1, 0, 0.0))


async def test_stop_lets_in_flight_finish_and_sends_nothing_after(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 100, concurrency=5)
    slow = Slow(0.05, busy_at=12)  # some answered, 5 in flight
    stats = RunStats({p.name: DatasetStats(items=p.items) for p in store.work.dataset_progress()})
    sched = Scheduler(
        store, build_lanes(job, {"default": slow}), job.run, stats, commit_interval_s=0.01
    )
    task = asyncio.create_task(sched.run())
    await slow.busy.wait()
    sched.stop("interrupted")
    started_at_stop = slow.started
    await task
    assert slow.started == started_at_stop >= 12  # nothing sent after the stop
    done = rows(store, "SELECT COUNT(*) FROM results")[0][0]
    assert done == started_at_stop  # every request in flight finished and was committed
    assert rows(store, "SELECT COUNT(*) FROM items WHERE status = 'pending'") == [(100 - done,)]


async def test_stop_grace_abandons_requests_that_take_too_long(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 10, concurrency=3, extra="stop_grace_s = 0.1")
    slow = Slow(30, busy_at=3)
    stats = RunStats({p.name: DatasetStats(items=p.items) for p in store.work.dataset_progress()})
    sched = Scheduler(
        store, build_lanes(job, {"default": slow}), job.run, stats, commit_interval_s=0.01
    )
    task = asyncio.create_task(sched.run())
    await slow.busy.wait()
    sched.stop("interrupted")
    await asyncio.wait_for(task, timeout=5)
    assert rows(store, "SELECT COUNT(*) FROM items WHERE status = 'pending'") == [(10,)]


def test_backoff_is_jittered_capped_and_floors_at_retry_after() -> None:
    rng = random.Random(3)
    waits = [backoff_s(n, None, rng) for n in range(1, 20)]
    assert all(0 <= w <= 30 for w in waits)
    assert len(set(waits)) == len(waits)
    assert backoff_s(1, 12.0, rng) == 12.0


def test_ingested_ids_are_the_vocabularys_ids(tmp_path: Path) -> None:
    from regen.conversation import Conversation
    from regen.sources.modes import item_id, prompt_hash

    job, store = make_job(tmp_path, 5)
    for p in store.work.claim_batch("chat", -1, 10):
        conv = Conversation.from_dict(p.dataset, p.row_index, p.conversation)
        assert p.conversation_id == conv.id
        assert p.id == item_id(conv.id, p.turn_index)
        (ph,) = rows(store, f"SELECT prompt_hash FROM items WHERE id = '{p.id}'")[0]
        assert ph == prompt_hash(conv, p.turn_index)


async def test_a_batch_that_cannot_be_written_stops_dispatch_and_is_saved_when_it_can(
    tmp_path: Path,
) -> None:
    from regen.errors import StateError

    job, store = make_job(tmp_path, 40, concurrency=2)
    real_commit = store.commit_outcomes
    failures = [StateError("state.db: write failed: database or disk is full")] * 3

    def commit(*args: Any) -> None:
        if failures:
            raise failures.pop()
        real_commit(*args)

    store.commit_outcomes = commit  # type: ignore[method-assign]
    async with scripted_server(lambda n, _: Reply()) as srv:
        stats = await run(job, store, srv.url)
    # The first failed write stopped dispatch; the answers it held were written on a retry
    # (all 40 may be in that batch when they all come back before the first write).
    assert stats.stop_reason is not None and "disk is full" in stats.stop_reason
    done = stats.datasets["chat"].done
    assert 0 < done <= 40
    assert rows(store, "SELECT COUNT(*) FROM results") == [(done,)]
    assert rows(store, "SELECT COUNT(*) FROM ledger") == [(done,)]


async def test_a_batch_never_written_is_reported_with_how_many_answers_it_held(
    tmp_path: Path,
) -> None:
    import pytest

    from regen.errors import StateError

    job, store = make_job(tmp_path, 40, "stop_grace_s = 0.2", concurrency=2)

    def commit(*args: Any) -> None:
        raise StateError("state.db: write failed: database or disk is full")

    store.commit_outcomes = commit  # type: ignore[method-assign]
    async with scripted_server(lambda n, _: Reply()) as srv:
        with pytest.raises(StateError, match=r"disk is full; \d+ finished answers could not be"):
            await run(job, store, srv.url)
    assert rows(store, "SELECT COUNT(*) FROM results") == [(0,)]


def test_lanes_read_streams_at_the_configured_interval(tmp_path: Path) -> None:
    job, store = make_job(tmp_path, 1, extra="stream_read_interval_s = 0.5")
    store.close()
    client = ChatClient("http://127.0.0.1:9/v1", None, concurrency=1)
    (lane,) = build_lanes(job, {e.name: client for e in job.endpoint_pool})
    assert lane.timeouts.read_interval_s == 0.5


TWO_LANES = """
[[lanes]]
name = "short"
concurrency = {short}
max_tokens = 100
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = {long}
max_tokens = 1000
"""


def escalating_job(
    tmp: Path, rows_: list[dict[str, Any]], short: int, long: int, mode: str = "last_turn"
) -> tuple[Job, Store]:
    write_rows(tmp / "chat.jsonl", rows_)
    job_file = write_job(tmp, "http://127.0.0.1:9/v1", datasets=[("chat", "chat.jsonl", "openai")])
    text = job_file.read_text().replace(
        "[[datasets]]", TWO_LANES.format(short=short, long=long) + "\n[[datasets]]", 1
    )
    job_file.write_text(text + f'mode = "{mode}"\n')
    job = load_job(job_file)
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))
    return job, store


def cut_on_the_short_lane(n: int, body: dict[str, Any]) -> Reply:
    """Every answer on the short lane hits max_tokens; the long lane answers."""
    if body["max_tokens"] == 100:
        truncated = {
            "choices": [{"finish_reason": "length", "message": {"content": "cut"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 100, "cost": 0.001},
        }
        return Reply(body=truncated, delay_s=0.001)
    return Reply(delay_s=0.005)


async def test_every_escalated_item_is_sent_by_a_wide_long_lane(tmp_path: Path) -> None:
    """The long lane's claim of escalated items must look past those already in flight: with
    a lane of 64, its first claims are all items it already sent."""
    job, store = escalating_job(tmp_path, chat_rows(400), short=64, long=64)
    async with (
        scripted_server(cut_on_the_short_lane) as srv,
        ChatClient(srv.url, "k", concurrency=256) as c,
    ):
        stats, _ = await run_with(job, store, {"default": c})
    assert rows(store, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("done", 400)]
    assert stats.lanes["short"].escalated == 400 and stats.lanes["long"].done == 400


async def test_a_long_lane_hands_out_its_escalations_in_the_order_they_came(
    tmp_path: Path,
) -> None:
    """A long lane of one behind a short lane of 16 that cuts every answer short, over two
    datasets: its backlog grows while it works, and it takes it first escalated, first out,
    the first dataset's before the second's (not in dispatch order, which mixed early and late
    escalations and left what a cap stops to where a pass over the keys stood)."""
    for name in "ab":
        write_rows(tmp_path / f"{name}.jsonl", chat_rows(60, f"Topic {name}"))
    datasets = [(n, f"{n}.jsonl", "openai") for n in "ab"]
    job_file = write_job(tmp_path, "http://127.0.0.1:9/v1", datasets=datasets)
    job_file.write_text(
        job_file.read_text().replace(
            "[[datasets]]", TWO_LANES.format(short=16, long=1) + "\n[[datasets]]", 1
        )
    )
    job = load_job(job_file)
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))

    def script(n: int, body: dict[str, Any]) -> Reply:
        # The short lane takes a while, so its escalations come in several commits.
        reply = cut_on_the_short_lane(n, body)
        return replace(reply, delay_s=0.1 if body["max_tokens"] == 100 else 0.02)

    async with scripted_server(script) as srv, ChatClient(srv.url, "k", concurrency=32) as c:
        stats, _ = await run_with(job, store, {"default": c})
    assert stats.lanes["long"].done == 120
    sent = rows(
        store,
        "SELECT i.escalated_at, i.dataset, i.order_key FROM attempts a "
        "JOIN items i ON i.id = a.item_id WHERE a.lane = 'long' ORDER BY a.started_at, a.id",
    )
    assert len(sent) == 120
    assert [at for at, _, _ in sent] == sorted(at for at, _, _ in sent)
    assert len({at for at, _, _ in sent}) >= 3
    # The short lane sent a's on before b's (16 at a time: a commit may hold both); their
    # keys are mixed.
    order = [ds for _, ds, _ in sent]
    assert order[:30] == ["a"] * 30 and order[-30:] == ["b"] * 30
    assert [key for *_, key in sent] != sorted(key for *_, key in sent)


async def test_a_sequential_turn_after_an_escalated_turn_is_sent(tmp_path: Path) -> None:
    conversations = [
        {
            "messages": [
                {"role": "user", "content": f"first question {i}"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": f"second question {i}"},
                {"role": "assistant", "content": "b"},
            ]
        }
        for i in range(20)
    ]
    job, store = escalating_job(tmp_path, conversations, short=4, long=4, mode="sequential")
    async with (
        scripted_server(cut_on_the_short_lane) as srv,
        ChatClient(srv.url, "k", concurrency=16) as c,
    ):
        await run_with(job, store, {"default": c}, sequential=["chat"])
    assert rows(store, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("done", 40)]


async def test_a_sequential_rescan_never_resends_a_turn_answered_but_not_yet_committed(
    tmp_path: Path,
) -> None:
    """A rescan used to skip only the turns in flight: a turn answered since the scan began
    but not yet committed still looked pending in the store and went out again (its second
    answer then failed to commit: UNIQUE constraint failed: results.item_id)."""
    import random as _random

    conversations = [
        {
            "messages": [
                m
                for t in range(3)
                for m in (
                    {"role": "user", "content": f"conversation {i} question {t}"},
                    {"role": "assistant", "content": "old"},
                )
            ]
        }
        for i in range(60)
    ]
    write_rows(tmp_path / "chat.jsonl", conversations)
    job = load_job(
        write_job(
            tmp_path,
            "http://127.0.0.1:9/v1",
            datasets=[("chat", "chat.jsonl", "openai")],
            concurrency=3,
        )
    )
    job_file = tmp_path / "job.toml"
    job_file.write_text(job_file.read_text() + 'mode = "sequential"\n')
    job = load_job(job_file)
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))
    delays = _random.Random(7)

    def script(n: int, body: dict[str, Any]) -> Reply:
        return Reply(delay_s=delays.choice((0.0, 0.0, 0.0, 0.02, 0.08)))

    async with scripted_server(script) as srv, ChatClient(srv.url, "k", concurrency=8) as c:
        stats = RunStats(
            {p.name: DatasetStats(items=p.items) for p in store.work.dataset_progress()}
        )
        sched = Scheduler(
            store,
            build_lanes(job, {"default": c}),
            job.run,
            stats,
            rng=random.Random(0),
            commit_interval_s=0.05,
            sequential=["chat"],
        )
        await sched.run()
    assert len(srv.requests) == 180  # each turn asked once
    assert rows(store, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("done", 180)]
