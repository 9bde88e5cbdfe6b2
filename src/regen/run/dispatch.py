"""Sending: the accounts opened, the endpoints checked, the scheduler started with its
side tasks (progress, timeline, live audit, metrics, credit, key limit) and signals, and the
accounts reconciled at the end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from regen.config import Job
from regen.engine.billing import (
    Account,
    Baseline,
    Reconciliation,
    UsageReader,
    billing_accounts,
    key_usage,
    reconcile_accounts,
    resolve_prices,
    take_baselines,
)
from regen.engine.budget import BudgetBook, Prices, budget_lines, learned_prices
from regen.engine.client import ChatClient
from regen.engine.client.keys import KeyApi
from regen.engine.gate import Gate
from regen.engine.holds import HoldKeeper
from regen.engine.job_keys import JobKeys
from regen.engine.scheduler import Scheduler
from regen.engine.stats import DatasetStats, JobTotals, RunStats
from regen.errors import ConfigError, StateError, one_line
from regen.events import fields
from regen.outputs.audit import Checks, LiveAudit, server_kwargs
from regen.reconstruct import Target, spec_from_store
from regen.run.accounts import (
    check_credit_floor,
    check_reachable,
    credit_reader,
    follow_key_limit,
    key_limit,
    key_name,
    management_key,
    watch_credit,
)
from regen.run.budgets import billed_after_gone, budget_book, hold_keeper
from regen.run.lanes import build_lanes, check_routes, lane_settings
from regen.run.pilot import TIME_UP
from regen.run.signals import stop_signals
from regen.state.db import Store
from regen.state.runs import OutageRecord, TimelinePoint
from regen.state.work import DatasetProgress
from regen.view.progress import Shown, Watch

log = logging.getLogger(__name__)

TIMELINE_EVERY_S = 1.0
"""How often a run records each lane's requests on the wire and adaptive limit."""


class LiveAuditTask:
    """`regen audit` as the run goes (with `[reconstruct]` and `live_audit` on): a sample of
    each interval's answers is rebuilt in a worker thread; a failing one is printed and logged,
    and the tally is kept in state.db for `regen status`. It never stops a run: a tokenizer
    that cannot load turns it off with one line."""

    def __init__(self, job: Job, store: Store, excluded: frozenset[str]) -> None:
        self.job, self.store, self.excluded = job, store, excluded
        self.live: LiveAudit | None = None
        self.off = False
        self._starting: asyncio.Future[LiveAudit] | None = None

    def _say(self, line: str) -> None:
        log.info(line)

    def _start(self) -> LiveAudit:
        assert self.job.reconstruct is not None
        spec = spec_from_store(
            reconstruct_meta(self.job),
            self.job.generation.model_dump(),
            server_kwargs(e.extra_body for e in self.job.endpoint_pool),
        )
        checks = Checks(excluded_providers=self.excluded)
        return LiveAudit(
            self.job.output_path, Target(spec), checks, self.job.reconstruct.live_audit_sample
        )

    async def step(self) -> None:
        if self.live is None:
            return
        try:
            drifts = await asyncio.to_thread(self.live.step)
        except Exception as exc:  # noqa: BLE001 - an audit problem must not stop a run
            self._say(f"live audit stopped: {one_line(exc)}")
            self.live = None
            return
        for d in drifts[:3]:
            self._say(d.line())
        if len(drifts) > 3:
            self._say(f"audit: {len(drifts) - 3} more failing samples in this check")
        self.store.set_meta("live_audit", json.dumps(self.live.summary()))

    async def _ensure_started(self) -> None:
        if self.live is not None or self.off:
            return
        # One start, whoever waits for it: a cancelled wait leaves the thread loading the
        # tokenizer, and a second load beside it would see transformers half imported.
        if self._starting is None:
            self._starting = asyncio.get_running_loop().run_in_executor(None, self._start)
        try:
            self.live = await asyncio.shield(self._starting)
        except Exception as exc:  # noqa: BLE001 - an audit that cannot start leaves the run be
            self.off = True
            self._say(f"live audit off: {one_line(exc)}")
            return
        for note in self.live.target.notes:
            self._say(f"note: {note}")
        for warning in self.live.target.warnings:
            self._say(f"warning: {warning}")

    async def run(self) -> None:
        await self._ensure_started()
        while self.live is not None:
            await asyncio.sleep(self.job.run.progress_interval_s)
            await self.step()

    async def finish(self) -> None:
        """A last look when dispatch ends (a short run may end before the first interval)."""
        await self._ensure_started()
        await self.step()


@dataclass
class Dispatched:
    """What dispatch leaves behind: live stats, budget lines, and the accounts' spend."""

    stats: RunStats
    budget_lines: list[str]
    reconciliations: list[Reconciliation]
    book: BudgetBook | None = None
    """The run's budgets as they ended (which datasets' budgets were met)."""


async def dispatch(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    shown: Shown = None,
    *,
    pilot: Mapping[str, int] | None = None,
    progress: list[DatasetProgress] | None = None,
    stop_at: tuple[float, str] | None = None,
    as_filed: Job | None = None,
) -> Dispatched:
    """Send every pending item under the job's budgets, showing progress; then reconcile.
    `pilot`: only until each dataset has as many answers as it names (items in dispatch
    order; a dataset it does not name sends none).
    `progress`: the datasets' counts as `prepare` just read them (each read counts every
    item: 0.1-0.2 s at a million).
    `stop_at`: (time.monotonic(), reason): sending stops then, as on any stop (a pilot's
    time bound).
    `as_filed`: the job as its file says, when `job` is a pilot round's bounded copy: the run
    is recorded with the file's dollar cap, not the pilot's.
    What it says goes out as events (`regen/events.py`); `shown` is how its progress is shown
    (view/progress.py's Watch; nowhere without one)."""
    if progress is None:
        progress = store.work.dataset_progress()
    stats = run_stats(job, store, progress)
    await check_reachable(job)
    async with contextlib.AsyncExitStack() as stack:
        ready = await open_and_check(job, store, keys, progress, stack, stats)
        keeper = await send(
            job,
            store,
            shown or Watch(),
            ready,
            stats,
            pilot=pilot,
            stop_at=stop_at,
            as_filed=as_filed,
        )
        reconciliations = await settle_accounts(store, ready, stats)
    book = ready.book
    return Dispatched(stats, budget_lines(book) + end_lines(keeper, stats), reconciliations, book)


@dataclass
class Ready:
    """What the checks before the first request leave: the accounts opened, their spend as
    it stood, the budgets and the endpoints' routes."""

    accounts: Accounts
    baselines: dict[str, Baseline]
    book: BudgetBook
    routes: Routes


async def open_and_check(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    progress: list[DatasetProgress],
    stack: contextlib.AsyncExitStack,
    stats: RunStats,
) -> Ready:
    """Open the run's accounts (closed with `stack`) and check what must hold before the
    first request: the credit floor, the accounts' spend so far, the budgets, the endpoints'
    prices and routes."""
    accounts = await open_accounts(job, store, keys, progress, stack, stats.gate)
    try:
        await check_credit_floor(job, accounts.billing, accounts.credit)
    finally:
        say_gate(stats)
    baselines = await take_baselines(store, accounts.billing, accounts.usage)
    book = budget_book(job, progress, store)
    routes = await check_endpoints(job, store, accounts, book, stats)
    return Ready(accounts, baselines, book, routes)


async def send(
    job: Job,
    store: Store,
    watch: Watch,
    ready: Ready,
    stats: RunStats,
    *,
    pilot: Mapping[str, int] | None,
    stop_at: tuple[float, str] | None,
    as_filed: Job | None,
) -> HoldKeeper:
    """Record the run's start, then run the scheduler to its end under `supervise` (stopped
    at `stop_at` if set); the holds' keeper is returned for the end's lines."""
    filed = as_filed or job
    run_id = store.runs.begin(
        "run" if pilot is None else "pilot", filed.budget.max_cost_usd, lane_settings(filed)
    )
    accounts, routes = ready.accounts, ready.routes
    scheduler, keeper = start_scheduler(
        job,
        store,
        accounts,
        routes,
        ready.baselines,
        ready.book,
        stats,
        pilot=pilot,
        run_id=run_id,
    )
    timer = asyncio.create_task(_stop_at(scheduler, stop_at))
    try:
        await supervise(
            job,
            store,
            watch,
            scheduler,
            keeper,
            accounts,
            routes,
            run_id,
            pilot=pilot is not None,
        )
    finally:
        timer.cancel()
    return keeper


async def settle_accounts(store: Store, ready: Ready, stats: RunStats) -> list[Reconciliation]:
    """Reconcile the accounts' spend with the ledger, then end the keys made for the run
    (a job with nothing left to send is done with them)."""
    accounts = ready.accounts
    reconciliations = await reconcile_accounts(
        store, accounts.billing, ready.baselines, accounts.usage, stats.gate
    )
    done_all = store.outstanding.held()[0] == 0 and not any(
        p.pending for p in store.work.dataset_progress()
    )
    for made in accounts.made.values():
        await made.end(job_done=done_all)
    return reconciliations


async def _stop_at(scheduler: Scheduler, stop_at: tuple[float, str] | None) -> None:
    """Stop the scheduler at a set time (nothing without one)."""
    if stop_at is None:
        return
    at, reason = stop_at
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    scheduler.stop(reason)


@dataclass
class Accounts:
    """Who pays for the run: its billing accounts, the clients that reach its endpoints, the
    keys made for it, and how each account's usage and credit are read."""

    billing: list[Account]
    clients: dict[str, ChatClient]
    made: dict[str, JobKeys]
    """Per account with a management key: the key made for this run."""
    start_limits: dict[str, float | None]
    """Per account with a management key: the credit limit its run's key started with."""
    usage: dict[str, UsageReader]
    credit: dict[str, Callable[[], Awaitable[float | None]]]


@dataclass(frozen=True)
class Routes:
    """What the endpoints said before the first request: prices, and the providers that
    each one's routing excludes."""

    prices: dict[str, Prices | None]
    excluded: dict[str, frozenset[str]]
    excluded_anywhere: frozenset[str]


def run_stats(job: Job, store: Store, progress: list[DatasetProgress]) -> RunStats:
    """The run's live counters, starting from what earlier runs did."""
    budgets = {d.name: d.token_budget for d in job.datasets}
    errors: dict[str, dict[str, int]] = {}
    for (dataset, cls), n in store.spend.failure_counts().items():
        errors.setdefault(dataset, {})[cls] = n
    return RunStats(
        datasets={
            p.name: DatasetStats(
                items=p.items,
                done_before=p.done,
                token_budget=budgets.get(p.name),
                before=JobTotals(
                    p.done,
                    p.failed,
                    p.prompt_tokens,
                    p.completion_tokens,
                    p.cost_usd,
                    errors.get(p.name, {}),
                ),
            )
            for p in progress
        },
        max_cost_usd=job.budget.max_cost_usd,
    )


async def open_accounts(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    progress: list[DatasetProgress],
    stack: contextlib.AsyncExitStack,
    gate: Gate | None = None,
) -> Accounts:
    """Make the run's keys (accounts with a management key: earlier runs' keys disabled
    first), open a client per endpoint sized for its lanes, and say how each account's usage
    and credit are read. Everything opened closes with `stack`."""
    billing = billing_accounts(job)
    made: dict[str, JobKeys] = {}
    start_limits: dict[str, float | None] = {}
    for a in billing:
        if a.management_key_env is None:
            continue
        api = KeyApi(a.base_url, management_key(a.management_key_env))
        await stack.enter_async_context(api)
        job_keys = JobKeys(store, api, a.key, a.management_key_env)
        limit = key_limit(job, progress, store, await job_keys.disable_earlier(), gate)
        secret = await job_keys.start(key_name(job), limit)
        keys = {**keys, **dict.fromkeys(a.endpoints, secret)}
        made[a.key], start_limits[a.key] = job_keys, limit
        note = (
            f"key: made a key for this run (hash {job_keys.current.hash[:12]}...) with a credit "
            f"limit of ${job_keys.limit_usd:.4f}, which OpenRouter enforces; earlier keys of "
            "the job are disabled"
            if job_keys.current is not None and job_keys.limit_usd is not None
            else "key: made a key for this run (no credit limit: the job has no dollar cap)"
        )
        log.info(note)
    pool_size: dict[str, int] = {}
    for lane in job.lane_list:
        for name in lane.endpoints or [e.name for e in job.endpoint_pool]:
            pool_size[name] = pool_size.get(name, 0) + lane.concurrency
    clients = {
        e.name: ChatClient(
            e.base_url,
            keys[e.name],
            concurrency=pool_size.get(e.name, 1),
            headers=e.headers,
            follow_redirects_to=e.follow_redirects_to,
        )
        for e in job.endpoint_pool
    }
    for c in clients.values():
        await stack.enter_async_context(c)
    usage = {
        a.key: made[a.key].usage if a.key in made else key_usage(clients[a.endpoints[0]], gate)
        for a in billing
    }
    credit = {a.key: credit_reader(a, clients, made, gate) for a in billing}
    return Accounts(billing, clients, made, start_limits, usage, credit)


async def check_endpoints(
    job: Job,
    store: Store,
    accounts: Accounts,
    book: BudgetBook,
    stats: RunStats,
) -> Routes:
    """Read the endpoints' prices (raised to what earlier answers were billed at) and routes,
    keep what `regen audit` and `regen export` need later, and refuse a dollar cap that has no
    prices to go by."""
    listed = await resolve_prices(job, accounts.clients, stats.gate)
    say_gate(stats)
    found, stats.repriced = learned_prices(listed, store)
    unproven: set[str] = set()
    excluded = await check_routes(job, accounts.clients, unproven)
    store.set_meta("unproven_providers", json.dumps(sorted(unproven)))
    # What `regen audit` and `regen export` need to rebuild and check ids later.
    excluded_anywhere = frozenset(set().union(*excluded.values()))
    store.set_meta("excluded_providers", json.dumps(sorted(excluded_anywhere)))
    if job.reconstruct is not None:
        store.set_meta("reconstruct", json.dumps(reconstruct_meta(job)))
    if book.needs_prices:
        unpriced = [name for name, p in found.items() if p is None]
        if unpriced:
            raise ConfigError(
                f"a dollar cap needs prices, and endpoint(s) {', '.join(unpriced)} list "
                f"none that regen can use for {job.generation.model} (a worst case needs a "
                "price above 0: see the gate's lines above): set prompt_usd_per_mtok and "
                "completion_usd_per_mtok in [endpoint]"
            )
    return Routes(found, excluded, excluded_anywhere)


def start_scheduler(
    job: Job,
    store: Store,
    accounts: Accounts,
    routes: Routes,
    baselines: dict[str, Baseline],
    book: BudgetBook,
    stats: RunStats,
    *,
    pilot: Mapping[str, int] | None,
    run_id: int,
) -> tuple[Scheduler, HoldKeeper]:
    """The scheduler over the job's lanes, with the holds of requests that earlier runs left
    outstanding loaded against the budgets (and said), stopped at once if the job's dollar
    cap is already met."""
    keeper = hold_keeper(
        job,
        store,
        book,
        accounts.clients,
        routes.prices,
        accounts.billing,
        baselines,
        accounts.usage,
        stats.gate,
    )
    scheduler = Scheduler(
        store,
        build_lanes(job, accounts.clients, routes.prices, routes.excluded),
        job.run,
        stats,
        budget=book,
        pilot=pilot,
        sequential=[d.name for d in job.datasets if d.mode == "sequential"],
        run_id=run_id,
        keeper=keeper,
    )
    keeper.settle = scheduler.settle_held
    keeper.flush = scheduler.flush
    keeper.key_limits = bool(accounts.made) and job.budget.max_cost_usd is not None
    stats.holds = keeper.summary
    held = keeper.load(store.outstanding.all(), billed_after_gone(job))
    scheduler.flush()  # requests to servers that bill nothing after a kill leave at once
    if held:
        log.info(f"budget: {keeper.summary().line()}")
    if book.job_cap_met():
        scheduler.stop(
            f"the job's dollar cap [budget].max_cost_usd = {job.budget.max_cost_usd:g} is "
            f"met (${book.job.charged_usd:.4f} spent)",
            budget=True,
        )
    return scheduler, keeper


async def supervise(
    job: Job,
    store: Store,
    watch: Watch,
    scheduler: Scheduler,
    keeper: HoldKeeper,
    accounts: Accounts,
    routes: Routes,
    run_id: int,
    *,
    pilot: bool = False,
) -> None:
    """Run the scheduler to its end with its side tasks (credit watch, key limits, timeline,
    progress, live audit, metrics) and the signals (`run/signals.py`: the first stops
    sending, a Ctrl-C during the stop cuts requests in flight short); then stop them all and
    record the run's end."""
    stats = scheduler.stats
    tasks, auditor = start_side_tasks(
        job, store, watch, scheduler, keeper, accounts, routes, run_id
    )
    metrics_cleanup = await serve_run_metrics(job, stats)
    main = asyncio.current_task()
    assert main is not None
    signalled = Stopping(job, scheduler, main)
    with (
        stop_signals() as signals,
        signals.sending(stop=signalled.stop, cut=signalled.cut, say=signalled.say),
    ):
        if signals.first is not None:  # a signal before the scheduler was there to stop
            scheduler.stop("interrupted")
        try:
            await scheduler.run()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if auditor is not None:
                await auditor.finish()
            if metrics_cleanup is not None:
                await metrics_cleanup()
            with contextlib.suppress(StateError):
                save_outages(store, run_id, stats)
                store.runs.end(run_id, stats.stop_reason, end_kind(store, stats, pilot=pilot))


def start_side_tasks(
    job: Job,
    store: Store,
    watch: Watch,
    scheduler: Scheduler,
    keeper: HoldKeeper,
    accounts: Accounts,
    routes: Routes,
    run_id: int,
) -> tuple[list[asyncio.Task[None]], LiveAuditTask | None]:
    """Start the run's side tasks (credit watch, key limits, timeline, progress, and the live
    audit when asked for, which is returned too: it takes a last look at the end)."""
    stats = scheduler.stats
    tasks = [
        asyncio.create_task(watch_credit(job, accounts.billing, accounts.credit, scheduler, stats))
    ]
    for account, made in accounts.made.items():
        start = accounts.start_limits[account]
        tasks.append(asyncio.create_task(follow_key_limit(made, start, keeper)))
    tasks.append(asyncio.create_task(sample_timeline(store, run_id, stats)))
    reporter = watch.reporter(
        stats,
        job.run.progress_interval_s,
        job.output_path / "run.log",
        publish=lambda fields: publish_progress(store, fields),
    )
    tasks.append(asyncio.create_task(reporter.run()))
    auditor = None
    if job.reconstruct is not None and job.reconstruct.live_audit:
        auditor = LiveAuditTask(job, store, routes.excluded_anywhere)
        tasks.append(asyncio.create_task(auditor.run()))
    return tasks, auditor


async def serve_run_metrics(job: Job, stats: RunStats) -> Callable[[], Awaitable[None]] | None:
    """Serve `/metrics` when [run].metrics_port asks for it, and say where; return what
    stops it (None without a port)."""
    if job.run.metrics_port is None:
        return None
    from regen.view.metrics import serve_metrics

    try:
        metrics = await serve_metrics(stats, job.run.metrics_host, job.run.metrics_port)
    except OSError as exc:
        raise ConfigError(
            f"[run].metrics_port: cannot listen on {job.run.metrics_host}:"
            f"{job.run.metrics_port}: {exc.strerror or exc}"
        ) from exc
    url = f"http://{job.run.metrics_host}:{job.run.metrics_port}/metrics"
    log.info(f"metrics: {url}", extra=fields("metrics", url=url))
    return metrics.cleanup


class Stopping:
    """What the signals do while the scheduler sends (`run/signals.py`): the first stops
    sending, a Ctrl-C during the stop cuts requests in flight short; each says so."""

    def __init__(self, job: Job, scheduler: Scheduler, main: asyncio.Task[object]) -> None:
        self.job, self.scheduler, self.main = job, scheduler, main

    def say(self, line: str) -> None:
        """One line said (an event: the terminal and run.log)."""
        log.info(line)

    def stop(self, name: str) -> None:
        """Stop sending: requests in flight may finish within the grace."""
        self.scheduler.stop("interrupted")
        self.say(
            f"stopping: no new requests; {self.scheduler.stats.in_flight} in flight may finish "
            f"within {self.job.run.stop_grace_s:g} s and are kept (Ctrl-C again cuts them "
            "short; another SIGTERM changes nothing)"
        )

    def cut(self) -> None:
        """Cut requests in flight short: the dispatch task is cancelled."""
        self.say(
            f"stopping now (Ctrl-C again): {self.scheduler.stats.in_flight} requests in flight "
            "are cut short; their items stay pending, and what they cost is looked up by the "
            "next run"
        )
        self.main.cancel()


def end_kind(store: Store, stats: RunStats, *, pilot: bool) -> str:
    """How a run ended, in a word or two, for `regen status` and the report: interrupted,
    pilot bound, cap (the job's dollar cap or the credit floor), outage, stopped (an error),
    budgets met (it ended with items left that no budget let go), or finished."""
    reason = stats.stop_reason
    if reason in ("interrupted", TIME_UP):
        return "pilot bound" if reason == TIME_UP else "interrupted"
    if stats.budget_stop:
        return "cap"
    if stats.outage:
        return "outage"
    if reason:
        return "stopped"
    if not pilot and any(p.pending for p in store.work.dataset_progress()):
        return "budgets met"
    return "finished"


def say_gate(stats: RunStats) -> None:
    """Say what the gate refused since it last said (`engine/gate.py`)."""
    for line in stats.gate.take_lines():
        log.info(line)


def end_lines(keeper: HoldKeeper, stats: RunStats) -> list[str]:
    """What the run's end says of money beyond the budgets' own lines: requests that may
    still be billed, bills that never showed, endpoints billed above their prices."""
    lines = []
    summary = keeper.summary()
    if summary.requests:
        bound = f"up to ${summary.usd:.4f}" if summary.usd > 0 else "unpriced"
        lines.append(
            f"budget: {summary.requests} requests may still be billed ({bound}): their bills "
            "were not found yet; the next run holds them against the budgets until they are"
        )
    if keeper.released_unverified > 0:
        lines.append(
            f"budget: ${keeper.released_unverified:.4f} counted for requests whose bills "
            "never showed (at most their worst case, as the account's spend beyond the "
            "ledger allowed)"
        )
    lines += stats.gate.end_lines()
    for name, factor in stats.repriced.items():
        lines.append(
            f"endpoint {name}: answers were billed up to {factor:.2f}x the prices regen had "
            "for it, so the worst cases under the dollar caps use the billed rate from then on; "
            "give the provider's current prices in [endpoint] (*_usd_per_mtok) or leave them out "
            "to read OpenRouter's"
        )
    return lines


async def sample_timeline(
    store: Store, run_id: int, stats: RunStats, every_s: float = TIMELINE_EVERY_S
) -> None:
    """Until cancelled, record each lane's requests on the wire and adaptive limit (the
    report's timeline; the limit it settles at is what `regen plan` expects next time), and
    the endpoints out of their pool. A write that fails stops the sampling, not the run: the
    run's own writes will say why."""
    while True:
        now = time.time()
        points = [
            TimelinePoint(run_id, now, name, lane.in_flight, lane.limit, lane.concurrency)
            for name, lane in stats.lanes.items()
        ]
        try:
            store.runs.add_timeline(points)
            save_outages(store, run_id, stats)
        except StateError:
            return
        await asyncio.sleep(every_s)


def save_outages(store: Store, run_id: int, stats: RunStats) -> None:
    """The run's outages as they stand now, for `regen status` and the report."""
    store.runs.save_outages(
        OutageRecord(run_id, name, o.start, o.end, o.resent)
        for name, ep in stats.endpoints.items()
        for o in ep.outages
    )


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep Python's cyclic garbage collector out of the dispatch loop's way. What was loaded
    before (modules, config, tokenizers: often millions of objects) is frozen, so collections
    do not walk it again and again, and collections run every 50,000 allocations rather than
    700. With 2,000 requests in flight this cut a run's CPU by about a tenth (docs/
    benchmarks.md). A request leaves about one small cycle behind, so memory stays bounded."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def reconstruct_meta(job: Job) -> dict[str, object]:
    """`[reconstruct]` with its paths made absolute (audit and export run from anywhere)."""
    assert job.reconstruct is not None
    meta = job.reconstruct.model_dump(exclude_none=True)
    for key in ("tokenizer", "chat_template"):
        value = meta.get(key)
        if value and value != "sim":
            path = Path(job.base_dir) / Path(value).expanduser()
            if path.exists():
                meta[key] = str(path.resolve())
    return meta


def publish_progress(store: Store, fields: dict[str, str]) -> None:
    """The run's last progress fields in state.db, where `regen status` reads them (rates and
    requests in flight, which only the running process knows). A write that fails is left:
    the next tick writes again, and progress is a view that never stops a run."""
    with contextlib.suppress(StateError, sqlite3.Error):
        store.set_meta("live_progress", json.dumps(fields))
