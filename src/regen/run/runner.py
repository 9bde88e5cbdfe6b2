"""`regen run`: the whole flow for one job, from sources to exports, in one direction."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from regen import __version__
from regen.config import EndpointConfig, Job, fingerprint_changes
from regen.conversation import (
    Request,
    canonical_json,
)
from regen.engine.billing import (
    Account,
    Baseline,
    Reconciliation,
    UsageReader,
    billing_accounts,
    key_usage,
    poll_credit,
    reconcile_accounts,
    remaining_credit,
    resolve_prices,
    take_baselines,
)
from regen.engine.budget import LENGTH_WINDOW, BudgetBook, Prices
from regen.engine.client import RETRYABLE, STOPS_RUN, ChatClient, Timeouts, chat_body
from regen.engine.client.account import JsonGetter
from regen.engine.client.keys import KeyApi
from regen.engine.holds import HoldKeeper
from regen.engine.job_keys import JobKeys
from regen.engine.providers import excluded_names, fetch_endpoints, shared_name_warning, verdicts
from regen.engine.scheduler import (
    CLIENT_ERRORS,
    DatasetStats,
    EndpointRuntime,
    JobTotals,
    LaneRuntime,
    RunStats,
    Scheduler,
    Sender,
    learned_prices,
)
from regen.errors import ConfigError, RegenError, StateError
from regen.lock import RunLock
from regen.outputs.audit import Checks, LiveAudit, server_kwargs
from regen.outputs.export import clean_stale_exports, export_specforge
from regen.outputs.report import write_report
from regen.reconstruct import Target, spec_from_store
from regen.sources.ingest import ingest, lane_rules
from regen.state.db import Store
from regen.state.runs import TimelinePoint
from regen.state.work import DatasetProgress
from regen.view.progress import (
    ProgressReporter,
    append_log,
    dataset_start_line,
    reconciliation_line,
)

SELF_HOSTED = ("vllm", "sglang")
TIMELINE_EVERY_S = 1.0
"""How often a run records each lane's requests on the wire and adaptive limit."""


@dataclass
class RunReport:
    """What a finished (or stopped) run did; everything in it was read back from state.db."""

    out_dir: Path
    datasets: list[DatasetProgress]
    exports: dict[str, int]
    errors: dict[tuple[str, str], int]
    stop_reason: str | None = None
    interrupted: bool = False
    """Stopped by a signal: what finished is kept, the rest is sent by the next run."""
    aborted: bool = False
    """A second signal cut requests in flight short."""
    unassigned: dict[str, int] = field(default_factory=dict)
    """Pending items no lane selects, per dataset (they are not sent)."""
    blocked: dict[str, int] = field(default_factory=dict)
    """Sequential mode: pending turns whose earlier turn failed, per dataset."""
    reconciliations: list[Reconciliation] = field(default_factory=list)
    """Per billing account: spend since the job started, by the provider and by the ledger."""
    budget_lines: list[str] = field(default_factory=list)
    """Per dataset with a budget: what it used, and why it stopped if it did."""
    budget_stop: bool = False
    """Stopped at the job's dollar cap or credit floor: a planned end."""
    outage: bool = False
    """Stopped because every server of a lane stayed down (`[run] pool_down_timeout_s`)."""
    drained: dict[str, int] = field(default_factory=dict)
    """Per endpoint of a pool: times it was taken out (its server down or loading)."""
    counted_usage: dict[tuple[str, str], int] = field(default_factory=dict)
    """Answers whose server sent no usage, by (dataset, `ids` or `estimate`)."""
    unsent: list[Unsent] = field(default_factory=list)
    """The items left pending at the end, by dataset and why."""
    unproven: dict[str, int] = field(default_factory=dict)
    """Answers per provider name that an allowed and an excluded endpoint share."""

    @property
    def failed(self) -> int:
        return sum(d.failed for d in self.datasets)


def api_key_from_env(endpoint: EndpointConfig) -> str | None:
    """The key from the variable that the endpoint names; self-hosted servers may need none,
    and an endpoint with a management key gets a key made for the run instead (`job_keys`)."""
    if endpoint.management_key_env is not None:
        management_key(endpoint.management_key_env)  # said now, before anything is read
        return None
    name = endpoint.api_key_env
    key = os.environ.get(name, "").strip()
    if not key and endpoint.dialect not in SELF_HOSTED:
        raise ConfigError(f"set {name} or name another variable in [endpoint].api_key_env")
    return key or None


def management_key(env: str) -> str:
    key = os.environ.get(env, "").strip()
    if not key:
        raise ConfigError(f"set {env} or name another variable in [endpoint].management_key_env")
    return key


def health_url(base_url: str) -> str:
    """A vLLM or SGLang server's `/health`, at the root beside its `/v1`."""
    return base_url.rstrip("/").removesuffix("/v1") + "/health"


def _make_body(
    job: Job, endpoint: EndpointConfig
) -> Callable[[Request, int, bool], dict[str, Any]]:
    def make(req: Request, max_tokens: int, stream: bool) -> dict[str, Any]:
        return chat_body(req, job.generation, endpoint, max_tokens, stream=stream)

    return make


def _one_line(exc: BaseException) -> str:
    """An exception as one line: regen's own as they are, others with their type."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(exc, RegenError) and first else f"{type(exc).__name__}: {first}"


class LiveAuditTask:
    """`regen audit` as the run goes (with `[reconstruct]` and `live_audit` on): a sample of
    each interval's answers is rebuilt in a worker thread; a failing one is printed and logged,
    and the tally is kept in state.db for `regen status`. It never stops a run: a tokenizer
    that cannot load turns it off with one line."""

    def __init__(self, job: Job, store: Store, console: Console, excluded: frozenset[str]) -> None:
        self.job, self.store, self.console, self.excluded = job, store, console, excluded
        self.live: LiveAudit | None = None
        self.off = False
        self._starting: asyncio.Future[LiveAudit] | None = None

    def _say(self, line: str) -> None:
        self.console.print(line, markup=False)
        with contextlib.suppress(StateError):
            append_log(self.job.output_path / "run.log", [line])

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
            self._say(f"live audit stopped: {_one_line(exc)}")
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
            self._say(f"live audit off: {_one_line(exc)}")
            return
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


async def check_routes(
    job: Job, clients: Mapping[str, JsonGetter], console: Console, unproven: set[str]
) -> dict[str, frozenset[str]]:
    """For each OpenRouter endpoint: the model's provider endpoints against the job's
    `provider` filters and max_tokens. Filters that leave nothing stop the run before it
    sends; the display names only excluded endpoints carry are returned (an answer that
    names one is `excluded_provider`). A catalogue that cannot be read changes nothing.
    `unproven` gets the names that an allowed and an excluded endpoint share (their answers
    cannot be proven to come from the allowed one)."""
    out: dict[str, frozenset[str]] = {}
    for e in job.endpoint_pool:
        if e.dialect != "openrouter":
            continue
        endpoints = await fetch_endpoints(clients[e.name], job.generation.model)
        if not endpoints:
            continue
        lanes = [lane for lane in job.lane_list if not lane.endpoints or e.name in lane.endpoints]
        max_tokens = min((job.lane_max_tokens(lane) for lane in lanes), default=0)
        verdict = verdicts(endpoints, e.provider, max_tokens)
        if all(v is not None for v in verdict.values()):
            why = "; ".join(f"{tag}: {reason}" for tag, reason in verdict.items())
            raise ConfigError(
                f"endpoint '{e.name}': no provider endpoint of {job.generation.model} is left "
                f"for max_tokens {max_tokens} ({why}); every request would fail with 404. "
                f"See `regen providers {job.generation.model} --job JOB.toml`"
            )
        only_excluded, mixed = excluded_names(endpoints, verdict)
        if mixed:
            advice = shared_name_warning(endpoints, e.provider, verdict)
            console.print(
                f"note: endpoint '{e.name}': {', '.join(sorted(mixed))} also serve(s) from an "
                "excluded endpoint; an answer names only its provider, so those answers cannot "
                "be proven to come from an allowed endpoint (routing honours the filters)"
                + (f". {advice}" if advice else ""),
                markup=False,
                soft_wrap=True,
            )
            unproven.update(mixed)
        out[e.name] = frozenset(only_excluded)
    return out


def build_lanes(
    job: Job,
    senders: Mapping[str, Sender],
    prices: Mapping[str, Prices | None] | None = None,
    excluded: Mapping[str, frozenset[str]] | None = None,
) -> list[LaneRuntime]:
    """The job's lanes, each with its endpoints (by name in `senders`) and settings."""
    prices = prices or {}
    excluded = excluded or {}
    runtimes = {
        e.name: EndpointRuntime(
            e.name,
            senders[e.name],
            _make_body(job, e),
            e.weight,
            prices=prices.get(e.name),
            generation_records=e.dialect == "openrouter",
            job_key=e.management_key_env is not None,
            billed_after_gone=e.dialect not in SELF_HOSTED,
            excluded_providers=excluded.get(e.name, frozenset()),
            health_url=health_url(e.base_url) if e.dialect in SELF_HOSTED else None,
        )
        for e in job.endpoint_pool
    }
    order = [d.name for d in job.datasets]
    return [
        LaneRuntime(
            name=lane.name,
            concurrency=lane.concurrency,
            max_tokens=job.lane_max_tokens(lane),
            timeouts=Timeouts(
                total_s=job.lane_timeout_s(lane),
                connect_s=job.run.connect_timeout_s,
                ttfb_s=job.run.ttfb_timeout_s,
                idle_s=job.run.idle_timeout_s,
                read_interval_s=job.run.stream_read_interval_s,
            ),
            endpoints=[runtimes[n] for n in lane.endpoints or list(runtimes)],
            datasets=[d for d in order if lane.datasets is None or d in lane.datasets],
            stream=lane.stream,
            escalate_to=lane.escalate_to,
        )
        for lane in job.lane_list
    ]


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


@dataclass(frozen=True)
class Unsent:
    """Items of a dataset left pending when a run ended, and why."""

    dataset: str
    items: int
    reason: str
    kind: str
    """`budget`: the dataset's own budget is met (its planned end); `cap`: the job's dollar
    cap or the credit floor stopped the run; `left`: anything else (the next run sends them)."""


def unsent_items(
    job: Job,
    store: Store,
    *,
    stop_reason: str | None,
    budget_stop: bool,
    unassigned: dict[str, int],
    blocked: dict[str, int],
    book: BudgetBook | None = None,
) -> list[Unsent]:
    """Every item a run leaves pending, with the reason it was not sent. An item no reason
    covers is said to be one: a run never ends with work left in silence. `book`: the run's
    budgets as they ended (a dollar cap is met when the next request no longer fits, before
    the spend reaches it, which only the run's own book knows)."""
    progress = store.work.dataset_progress()
    if book is None:
        book = budget_book(job, progress)
    out: list[Unsent] = []
    for p in progress:
        n = p.pending
        for reason, k in (
            ("no lane selects them (see [[lanes]] datasets and prompt sizes)", unassigned),
            ("they wait for an earlier turn of their conversation that failed", blocked),
        ):
            take = min(n, k.get(p.name, 0))
            if take:
                out.append(Unsent(p.name, take, reason, "left"))
                n -= take
        if n <= 0:
            continue
        state = book.datasets.get(p.name)
        if state is None:
            out.append(Unsent(p.name, n, "the dataset is no longer in the job file", "budget"))
        elif state.met is not None:
            out.append(Unsent(p.name, n, f"its budget is met: {state.met}", "budget"))
        elif budget_stop and stop_reason:
            out.append(Unsent(p.name, n, stop_reason, "cap"))
        elif stop_reason == "interrupted":
            out.append(Unsent(p.name, n, "the run was interrupted", "left"))
        elif stop_reason:
            out.append(Unsent(p.name, n, f"the run stopped: {stop_reason}", "left"))
        else:
            out.append(
                Unsent(
                    p.name,
                    n,
                    "not sent for a reason regen does not know (a bug: please report it with "
                    "run.log)",
                    "left",
                )
            )
    return out


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
    console: Console,
    *,
    pilot: int | None = None,
    progress: list[DatasetProgress] | None = None,
) -> Dispatched:
    """Send every pending item under the job's budgets, showing progress; then reconcile.
    `pilot`: only until each dataset has that many answers (items in dispatch order).
    `progress`: the datasets' counts as `prepare` just read them (each read counts every
    item: 0.1-0.2 s at a million)."""
    if progress is None:
        progress = store.work.dataset_progress()
    budgets = {d.name: d.token_budget for d in job.datasets}
    errors: dict[str, dict[str, int]] = {}
    for (dataset, cls), n in store.spend.failure_counts().items():
        errors.setdefault(dataset, {})[cls] = n
    stats = RunStats(
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
    pool_size: dict[str, int] = {}
    for lane in job.lane_list:
        for name in lane.endpoints or [e.name for e in job.endpoint_pool]:
            pool_size[name] = pool_size.get(name, 0) + lane.concurrency
    await check_reachable(job)
    accounts = billing_accounts(job)
    async with contextlib.AsyncExitStack() as stack:
        job_keys: dict[str, JobKeys] = {}
        limit: float | None = None
        for a in accounts:
            if a.management_key_env is None:
                continue
            api = KeyApi(a.base_url, management_key(a.management_key_env))
            await stack.enter_async_context(api)
            made = JobKeys(store, api, a.key, a.management_key_env)
            limit = key_limit(job, progress, store, await made.disable_earlier())
            secret = await made.start(key_name(job), limit)
            keys = {**keys, **dict.fromkeys(a.endpoints, secret)}
            job_keys[a.key] = made
            note = (
                f"key: made a key for this run (hash {made.current.hash[:12]}...) with a credit "
                f"limit of ${made.limit_usd:.4f}, which OpenRouter enforces; earlier keys of "
                "the job are disabled"
                if made.current is not None and made.limit_usd is not None
                else "key: made a key for this run (no credit limit: the job has no dollar cap)"
            )
            console.print(note, markup=False, highlight=False, soft_wrap=True)
            append_log(job.output_path / "run.log", [note])
        clients = {
            e.name: ChatClient(
                e.base_url, keys[e.name], concurrency=pool_size.get(e.name, 1), headers=e.headers
            )
            for e in job.endpoint_pool
        }
        for c in clients.values():
            await stack.enter_async_context(c)
        usage = {
            a.key: (
                job_keys[a.key].usage if a.key in job_keys else key_usage(clients[a.endpoints[0]])
            )
            for a in accounts
        }
        credit = {a.key: credit_reader(a, clients, job_keys) for a in accounts}
        await check_credit_floor(job, accounts, credit)
        baselines = await take_baselines(store, accounts, usage)
        book = budget_book(job, progress, store)
        prices, stats.repriced = learned_prices(await resolve_prices(job, clients), store)
        unproven: set[str] = set()
        excluded = await check_routes(job, clients, console, unproven)
        store.set_meta("unproven_providers", json.dumps(sorted(unproven)))
        # What `regen audit` and `regen export` need to rebuild and check ids later.
        excluded_anywhere = frozenset(set().union(*excluded.values()))
        store.set_meta("excluded_providers", json.dumps(sorted(excluded_anywhere)))
        if job.reconstruct is not None:
            store.set_meta("reconstruct", json.dumps(reconstruct_meta(job)))
        if book.needs_prices:
            unpriced = [name for name, p in prices.items() if p is None]
            if unpriced:
                raise ConfigError(
                    f"a dollar cap needs prices, and endpoint(s) {', '.join(unpriced)} list "
                    "none: set prompt_usd_per_mtok and completion_usd_per_mtok in [endpoint]"
                )
        run_id = store.runs.begin(
            "run" if pilot is None else "pilot", job.budget.max_cost_usd, lane_settings(job)
        )
        keeper = hold_keeper(job, store, book, clients, prices, accounts, baselines, usage)
        scheduler = Scheduler(
            store,
            build_lanes(job, clients, prices, excluded),
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
        keeper.key_limits = bool(job_keys) and job.budget.max_cost_usd is not None
        stats.holds = keeper.summary
        held = keeper.load(store.outstanding.all(), billed_after_gone(job))
        scheduler.flush()  # requests to servers that bill nothing after a kill leave at once
        if held:
            line = f"budget: {keeper.summary().line()}"
            console.print(line, markup=False, highlight=False, soft_wrap=True)
            append_log(job.output_path / "run.log", [line])
        if book.job_cap_met():
            scheduler.stop(
                f"the job's dollar cap [budget].max_cost_usd = {job.budget.max_cost_usd:g} is "
                f"met (${book.job.charged_usd:.4f} spent)",
                budget=True,
            )
        tasks = [asyncio.create_task(watch_credit(job, accounts, credit, scheduler, stats))]
        for made in job_keys.values():
            tasks.append(asyncio.create_task(follow_key_limit(made, limit, keeper)))
        tasks.append(asyncio.create_task(sample_timeline(store, run_id, stats)))
        reporter = ProgressReporter(
            stats, console, job.run.progress_interval_s, job.output_path / "run.log"
        )
        tasks.append(asyncio.create_task(reporter.run()))
        auditor = None
        if job.reconstruct is not None and job.reconstruct.live_audit:
            auditor = LiveAuditTask(job, store, console, excluded_anywhere)
            tasks.append(asyncio.create_task(auditor.run()))
        metrics = None
        if job.run.metrics_port is not None:
            from regen.view.metrics import serve_metrics

            try:
                metrics = await serve_metrics(stats, job.run.metrics_host, job.run.metrics_port)
            except OSError as exc:
                raise ConfigError(
                    f"[run].metrics_port: cannot listen on {job.run.metrics_host}:"
                    f"{job.run.metrics_port}: {exc.strerror or exc}"
                ) from exc
            console.print(
                f"metrics: http://{job.run.metrics_host}:{job.run.metrics_port}/metrics",
                markup=False,
            )
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        signals = (signal.SIGINT, signal.SIGTERM)

        def on_signal() -> None:
            # First signal: stop dispatch, let in-flight requests finish. Second: abort now.
            if scheduler.stopping and main is not None:
                main.cancel()
                return
            scheduler.stop("interrupted")
            line = (
                f"stopping: no new requests; {stats.in_flight} in flight may finish within "
                f"{job.run.stop_grace_s:g} s and are kept (a second signal cuts them short)"
            )
            console.print(line, markup=False, highlight=False)
            with contextlib.suppress(StateError):
                append_log(job.output_path / "run.log", [line])

        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
        try:
            await scheduler.run()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if auditor is not None:
                await auditor.finish()
            if metrics is not None:
                await metrics.cleanup()
            with contextlib.suppress(StateError):
                store.runs.end(run_id, stats.stop_reason)
            for sig in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        reconciliations = await reconcile_accounts(store, accounts, baselines, usage)
        done_all = store.outstanding.held()[0] == 0 and not any(
            p.pending for p in store.work.dataset_progress()
        )
        for made in job_keys.values():
            await made.end(job_done=done_all)
        held_lines = []
        summary = keeper.summary()
        if summary.requests:
            held_lines.append(
                f"budget: {summary.requests} requests may still be billed (up to "
                f"${summary.usd:.4f}): their bills were not found yet; the next run holds them "
                "against the budgets until they are"
            )
        if keeper.released_unverified > 0:
            held_lines.append(
                f"budget: ${keeper.released_unverified:.4f} counted for requests whose bills "
                "never showed (at most their worst case, as the account's spend beyond the "
                "ledger allowed)"
            )
    for name, factor in stats.repriced.items():
        held_lines.append(
            f"endpoint {name}: answers were billed up to {factor:.2f}x the prices regen had "
            "for it, so the worst cases under the dollar caps use the billed rate from then on; "
            "give the provider's current prices in [endpoint] (*_usd_per_mtok) or leave them out "
            "to read OpenRouter's"
        )
    return Dispatched(stats, book.report() + held_lines, reconciliations, book)


def lane_settings(job: Job) -> dict[str, dict[str, Any]]:
    """What the report needs to know of each lane, as this run had it."""
    return {
        lane.name: {
            "max_tokens": job.lane_max_tokens(lane),
            "concurrency": lane.concurrency,
            "escalate_to": lane.escalate_to,
        }
        for lane in job.lane_list
    }


async def sample_timeline(
    store: Store, run_id: int, stats: RunStats, every_s: float = TIMELINE_EVERY_S
) -> None:
    """Until cancelled, record each lane's requests on the wire and adaptive limit (the
    report's timeline; the limit it settles at is what `regen plan` expects next time). A
    write that fails stops the sampling, not the run: the run's own writes will say why."""
    while True:
        now = time.time()
        points = [
            TimelinePoint(run_id, now, name, lane.in_flight, lane.limit, lane.concurrency)
            for name, lane in stats.lanes.items()
        ]
        try:
            store.runs.add_timeline(points)
        except StateError:
            return
        await asyncio.sleep(every_s)


def billed_after_gone(job: Job) -> Callable[[str | None], bool]:
    """Whether a request to an endpoint may be billed after its client is gone: hosted APIs
    finish a generation whose connection closed (OpenRouter bills it when it ends); vLLM and
    SGLang abort it. An endpoint no longer in the job is assumed to bill."""
    dialects = {e.name: e.dialect for e in job.endpoint_pool}

    def bills(endpoint: str | None) -> bool:
        return dialects.get(endpoint or "") not in SELF_HOSTED

    return bills


def hold_keeper(
    job: Job,
    store: Store,
    book: BudgetBook,
    clients: Mapping[str, ChatClient],
    prices: Mapping[str, Prices | None],
    accounts: list[Account],
    baselines: Mapping[str, Baseline],
    usage: Mapping[str, UsageReader],
) -> HoldKeeper:
    """The keeper of this job's held requests: it reads bills from each OpenRouter endpoint's
    `/generation` and the accounts' spend beyond the ledger. Its `settle` and `flush` are the
    scheduler's, set once the scheduler exists."""

    async def unexplained() -> dict[str, float]:
        return {
            r.account.key: r.difference_usd
            for r in await reconcile_accounts(store, accounts, baselines, usage)
        }

    def nothing(*_: object) -> None:
        return None

    return HoldKeeper(
        book,
        lookup={e.name: clients[e.name] for e in job.endpoint_pool if e.dialect == "openrouter"},
        prices=prices,
        account_of={name: a.key for a in accounts for name in a.endpoints},
        unexplained=unexplained,
        settle=nothing,
        flush=nothing,
    )


async def check_reachable(job: Job) -> None:
    """The first error is the real one: a hosted endpoint that cannot be reached is said so
    before its keys, prices, credit or routes are read (each would fail in its own terms: a
    cap "needs prices", a floor "cannot be read"). Self-hosted servers may still be loading:
    their requests wait for their /health instead (`[run] pool_down_timeout_s`)."""
    for e in job.endpoint_pool:
        if e.dialect in SELF_HOSTED:
            continue
        async with ChatClient(e.base_url, None, concurrency=1, headers=e.headers) as probe:
            why = await probe.reach()
        if why is not None:
            raise ConfigError(
                f"endpoint {e.name}: {e.base_url} cannot be reached: {why} (is [endpoint]."
                "base_url right, and the network up?)"
            )


def credit_reader(
    account: Account, clients: Mapping[str, ChatClient], job_keys: Mapping[str, JobKeys]
) -> Callable[[], Awaitable[float | None]]:
    """How to read what an account may still spend: its key's remaining limit, else the
    account's credit; with a management key, the account's credit (`/credits`: the run's own
    key's limit is the job's cap, not the account's money)."""
    made = job_keys.get(account.key)
    if made is not None:
        return made.credit
    client = clients[account.endpoints[0]]
    return lambda: remaining_credit(client)


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
    job: Job, progress: list[DatasetProgress], store: Store, keys_used_usd: float
) -> float | None:
    """The credit limit of a key made for this run: what the job's cap still allows after
    the spend so far (the ledger's, or what the job's earlier keys have used as OpenRouter
    says, whichever is more) and what requests of killed runs may still be billed (None: no
    cap)."""
    cap = job.budget.max_cost_usd
    if cap is None:
        return None
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


FORCED_NOTE = "resuming with changed settings (--force)"


def check_fingerprint(store: Store, job: Job, *, force: bool) -> list[str]:
    """Refuse to resume a job whose data-affecting settings changed (unless forced); record
    them on the first run. Returns notes for the log."""
    fields = job.fingerprint_fields()
    stored = store.get_meta("fingerprint_fields")
    notes: list[str] = []
    if stored is not None:
        changes = fingerprint_changes(json.loads(stored), fields)
        if changes and not force:
            raise ConfigError(
                f"{store.path}: the job's data-affecting settings changed since it started "
                f"({'; '.join(changes)}); resuming would mix answers made with both. Undo the "
                "change, give another output directory (--out), or pass --force to resume anyway"
            )
        if not changes:
            return notes
        notes.append(f"{FORCED_NOTE}: {'; '.join(changes)}")
    store.set_meta("fingerprint_fields", canonical_json(fields))
    store.set_meta("fingerprint", job.fingerprint())
    if store.get_meta("regen_version") is None:
        store.set_meta("regen_version", __version__)
    return notes


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


def run_job(
    job: Job, *, console: Console, api_key: str | None = None, force: bool = False
) -> RunReport:
    """Ingest, dispatch, export and report. `api_key` defaults to the job's env variable;
    `force` resumes even if the job's data-affecting settings changed."""
    keys = endpoint_keys(job, api_key)
    out = job.output_path
    with RunLock(out) as lock:
        store = Store.open(out)
        try:
            return _run_locked(job, store, keys, console, force, lock.stale_pid)
        finally:
            store.close()


@dataclass(frozen=True)
class Prepared:
    """Where the datasets stand as a run starts sending."""

    unassigned: dict[str, int]
    """Pending items no lane selects, by dataset."""
    progress: list[DatasetProgress]


def prepare(
    job: Job, store: Store, console: Console, *, force: bool, stale_pid: int | None
) -> Prepared:
    """Before sending: check the fingerprint, ingest, re-queue transient failures, assign
    lanes, and say where each dataset stands."""
    notes = check_fingerprint(store, job, force=force) + dialect_notes(job)
    stale = clean_stale_exports(job.output_path / "export")
    if stale:
        notes.append(f"removed what an interrupted export left: {', '.join(stale)}")
    if stale_pid is not None:
        notes.insert(0, f"took over the lock of pid {stale_pid}, which ended without releasing it")
    notes += ingest(store, job)
    again = RETRYABLE | STOPS_RUN
    if any(note.startswith(FORCED_NOTE) for note in notes):
        # The job's settings changed: items the server refused (400, 404) may go through now.
        again |= CLIENT_ERRORS
    requeued = store.work.requeue_retryable_failures(again)
    if requeued and again & CLIENT_ERRORS:
        notes.append(f"{requeued} items that failed before are sent again with the new settings")
    unassigned = store.work.assign_lanes(lane_rules(job))
    progress = store.work.dataset_progress()
    refuse_unusable_datasets(job, store, progress)
    met = {name: d.met for name, d in budget_book(job, progress).datasets.items()}
    lines = notes + [dataset_start_line(p, met.get(p.name)) for p in progress]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    append_log(job.output_path / "run.log", lines)
    return Prepared(unassigned, progress)


def unproven_line(provider: str, answers: int) -> str:
    return (
        f"{answers} answers came from {provider}, which also serves from an endpoint the job "
        "excludes: an answer names only its provider, so these cannot be proven to come from "
        "an allowed one (see `regen providers MODEL --job JOB.toml` for a quantizations "
        "allow-list that keeps the excluded one out)"
    )


def unsent_line(u: Unsent) -> str:
    return f"dataset {u.dataset}: {u.items} items not sent: {u.reason}"


def refuse_unusable_datasets(job: Job, store: Store, progress: list[DatasetProgress]) -> None:
    """A dataset none of whose rows could be used (binary garbage, the wrong `format`) is an
    error naming its file and first bad rows, not a quiet "nothing to send"."""
    in_job = {d.name: d for d in job.datasets}
    for p in progress:
        ds = in_job.get(p.name)
        if ds is None or p.items or not p.bad_rows:
            continue
        first = store.sources.bad_rows(p.name, limit=3)
        source = store.sources.source(p.name)
        rows = "; ".join(f"row {b.row_index}: {b.reason[:150]}" for b in first)
        raise ConfigError(
            f"dataset {p.name}: none of the {p.bad_rows} rows of {source} can be used ({rows}); "
            f'check its format (now "{ds.format}") and path, and see its rows with `regen '
            f"inspect JOB --dataset {p.name}`"
        )


def dialect_notes(job: Job) -> list[str]:
    """What a self-hosted server will not do of the job's settings, said before sending."""
    reasoning = job.generation.reasoning or {}
    notes = []
    for e in job.endpoint_pool:
        if e.dialect == "vllm" and reasoning and set(reasoning) - {"effort"}:
            notes.append(
                f"note: endpoint {e.name} (vllm) has no `reasoning` object: only its effort is "
                "sent (reasoning_effort); switch thinking with extra_body = "
                "{ chat_template_kwargs = { enable_thinking = false } } (Kimi: thinking)"
            )
    return notes


def counted_usage_line(dataset: str, source: str, n: int) -> str:
    how = (
        "counted from the token ids it returned"
        if source == "ids"
        else "estimated from their text (about 4 bytes a token; budgets and prices use it)"
    )
    return f"dataset {dataset}: {n} answers came without usage from the server: {how}"


def drained_line(endpoint: str, times: int) -> str:
    return (
        f"endpoint {endpoint}: taken out of the pool {times} time(s) (server down or loading) "
        "and probed until it was back; its requests went to the other servers"
    )


def endpoint_keys(job: Job, api_key: str | None = None) -> dict[str, str | None]:
    """Each endpoint's key: `api_key` when given, else its environment variable."""
    return {
        e.name: api_key if api_key is not None else api_key_from_env(e) for e in job.endpoint_pool
    }


def _run_locked(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    console: Console,
    force: bool,
    stale_pid: int | None,
) -> RunReport:
    out = job.output_path
    prepared = prepare(job, store, console, force=force, stale_pid=stale_pid)
    unassigned = prepared.unassigned
    aborted = False
    reconciliations: list[Reconciliation] = []
    budget_lines: list[str] = []
    budget_stop = False
    drained: dict[str, int] = {}
    book: BudgetBook | None = None
    outage = False
    try:
        with quiet_gc():
            done = asyncio.run(dispatch(job, store, keys, console, progress=prepared.progress))
        stop_reason, budget_stop = done.stats.stop_reason, done.stats.budget_stop
        reconciliations, budget_lines = done.reconciliations, done.budget_lines
        drained, book, outage = done.stats.drained, done.book, done.stats.outage
    except (KeyboardInterrupt, asyncio.CancelledError):
        aborted, stop_reason = True, "interrupted"
    append_log(
        out / "run.log",
        budget_lines
        + [reconciliation_line(r) for r in reconciliations]
        + [drained_line(name, n) for name, n in drained.items()],
    )
    blocked = store.work.blocked_items()
    unproven = json.loads(store.get_meta("unproven_providers") or "[]")
    unsent = unsent_items(
        job,
        store,
        stop_reason=stop_reason,
        budget_stop=budget_stop,
        unassigned=unassigned,
        blocked=blocked,
        book=book,
    )
    append_log(out / "run.log", [unsent_line(u) for u in unsent if u.kind != "budget"])
    names = [d.name for d in job.datasets]
    exports = export_specforge(store, names, out / "export")
    try:
        write_report(out)
    except (StateError, sqlite3.Error) as exc:
        # The report is a view: failing to write it never fails the run.
        console.print(f"warning: report.html not written: {exc}", markup=False)
    return RunReport(
        out_dir=out,
        datasets=store.work.dataset_progress(),
        exports=exports,
        errors=store.spend.failure_counts(),
        stop_reason=stop_reason,
        interrupted=stop_reason == "interrupted",
        aborted=aborted,
        unassigned=unassigned,
        blocked=blocked,
        reconciliations=reconciliations,
        budget_lines=budget_lines,
        budget_stop=budget_stop,
        outage=outage,
        drained=drained,
        counted_usage=store.answers.usage_sources(),
        unsent=unsent,
        unproven=store.answers.answers_by_provider(unproven),
    )
