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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from regen import __version__
from regen.audit import Checks, LiveAudit, server_kwargs
from regen.billing import (
    Account,
    Baseline,
    Reconciliation,
    billing_accounts,
    poll_credit,
    reconcile_accounts,
    remaining_credit,
    resolve_prices,
    take_baselines,
)
from regen.budget import LENGTH_WINDOW, BudgetBook, Prices
from regen.client import RETRYABLE, STOPS_RUN, ChatClient, Timeouts, chat_body
from regen.client.account import JsonGetter
from regen.config import EndpointConfig, Job, fingerprint_changes
from regen.conversation import (
    Request,
    canonical_json,
)
from regen.errors import ConfigError, RegenError, StateError
from regen.export import clean_stale_exports, export_specforge
from regen.ingest import ingest, lane_rules
from regen.lock import RunLock
from regen.progress import (
    ProgressReporter,
    append_log,
    dataset_start_line,
    reconciliation_line,
)
from regen.providers import excluded_names, fetch_endpoints, shared_name_warning, verdicts
from regen.reconstruct import Target, spec_from_store
from regen.report import write_report
from regen.scheduler import (
    EXPOSURE_META,
    DatasetStats,
    DeadHold,
    EndpointRuntime,
    JobTotals,
    LaneRuntime,
    RunStats,
    Scheduler,
    Sender,
)
from regen.store import DatasetProgress, Store, TimelinePoint

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
    """The key from the variable that the endpoint names; self-hosted servers may need none."""
    name = endpoint.api_key_env
    key = os.environ.get(name, "").strip()
    if not key and endpoint.dialect not in SELF_HOSTED:
        raise ConfigError(f"set {name} or name another variable in [endpoint].api_key_env")
    return key or None


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
        d.name: store.recent_completion_lengths(d.name, LENGTH_WINDOW)
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
) -> list[Unsent]:
    """Every item a run leaves pending, with the reason it was not sent. An item no reason
    covers is said to be one: a run never ends with work left in silence."""
    progress = store.dataset_progress()
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
        progress = store.dataset_progress()
    budgets = {d.name: d.token_budget for d in job.datasets}
    errors: dict[str, dict[str, int]] = {}
    for (dataset, cls), n in store.failure_counts().items():
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
    clients = {
        e.name: ChatClient(
            e.base_url, keys[e.name], concurrency=pool_size.get(e.name, 1), headers=e.headers
        )
        for e in job.endpoint_pool
    }
    async with contextlib.AsyncExitStack() as stack:
        for c in clients.values():
            await stack.enter_async_context(c)
        accounts = billing_accounts(job)
        await check_credit_floor(job, accounts, clients)
        baselines = await take_baselines(store, accounts, clients)
        book = budget_book(job, progress, store)
        # Spend the provider reports beyond the ledger (answers lost in an earlier run's crash)
        # counts against the job's cap.
        for r in await reconcile_accounts(store, accounts, baselines, clients):
            book.count_unrecorded(r.difference_usd)
        prices = await resolve_prices(job, clients)
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
        scheduler = Scheduler(
            store,
            build_lanes(job, clients, prices, excluded),
            job.run,
            stats,
            budget=book,
            pilot=pilot,
            sequential=[d.name for d in job.datasets if d.mode == "sequential"],
        )
        holds = inherited_holds(store, job) if book.has_job_cap else []
        if holds:
            for h in holds:
                book.hold_dead(h.usd)
            scheduler.dead_holds = holds
            scheduler.save_exposure()  # so that a kill before the first request keeps them
            lines = hold_lines(holds)
            for line in lines:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            append_log(job.output_path / "run.log", lines)
        if book.job_cap_met() and not holds:
            scheduler.stop(
                f"the job's dollar cap [budget].max_cost_usd = {job.budget.max_cost_usd:g} is "
                f"met (${book.job.charged_usd:.4f} spent or possibly spent)",
                budget=True,
            )
        tasks = [asyncio.create_task(watch_credit(job, accounts, clients, scheduler, stats))]
        if holds:
            tasks.append(
                asyncio.create_task(
                    release_holds(scheduler, book, store, accounts, baselines, clients, console)
                )
            )
        run_id = store.begin_run(
            "run" if pilot is None else "pilot", job.budget.max_cost_usd, lane_settings(job)
        )
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
            from regen.metrics import serve_metrics

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
                store.end_run(run_id, stats.stop_reason)
            for sig in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        reconciliations = await reconcile_accounts(store, accounts, baselines, clients)
    return Dispatched(stats, book.report(), reconciliations)


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
            store.add_timeline(points)
        except StateError:
            return
        await asyncio.sleep(every_s)


def inherited_holds(store: Store, job: Job) -> list[DeadHold]:
    """What earlier runs that did not end cleanly (killed) may still be billed: their own
    exposure, held until a lane timeout from now (a request of theirs ends by then), and the
    holds they kept for runs before them, until their own times."""
    raw = store.get_meta(EXPOSURE_META)
    if not raw:
        return []
    data = json.loads(raw)
    now = time.time()
    holds = [DeadHold(**h) for h in data.get("holds", []) if h["until"] > now]
    if data.get("usd", 0) > 1e-12:
        timeout = max(job.lane_timeout_s(lane) for lane in job.lane_list)
        holds.append(DeadHold(float(data["usd"]), now + timeout, data.get("pid")))
    return holds


def hold_lines(holds: list[DeadHold]) -> list[str]:
    return [
        f"budget: holding ${h.usd:.4f} against the job's cap for requests of an earlier run"
        + (f" (pid {h.pid})" if h.pid else "")
        + " that may still be billed (OpenRouter bills an answer when it ends, after the client "
        f"is gone), until {time.strftime('%H:%M:%S', time.localtime(h.until))} or until the "
        "provider's usage shows them"
        for h in holds
    ]


async def release_holds(
    scheduler: Scheduler,
    book: BudgetBook,
    store: Store,
    accounts: list[Account],
    baselines: Mapping[str, Baseline],
    clients: Mapping[str, ChatClient],
    console: Console,
    poll_s: float = 2.0,
) -> None:
    """Release each hold for a killed run when its time is up, or all of them once the
    provider's usage beyond the ledger has grown by their whole worst case, counting what the
    provider billed beyond the ledger in their place."""
    while scheduler.dead_holds:
        first_due = min(h.until for h in scheduler.dead_holds) - time.time()
        await asyncio.sleep(max(0.05, min(poll_s, first_due)))
        unrecorded = sum(
            r.difference_usd for r in await reconcile_accounts(store, accounts, baselines, clients)
        )
        new = max(0.0, unrecorded - book.unrecorded_usd)
        holds = scheduler.dead_holds
        done = (
            holds
            if new >= sum(h.usd for h in holds)
            else [h for h in holds if h.until <= time.time()]
        )
        if done:
            scheduler.dead_holds = [h for h in holds if h not in done]
            book.release_dead(sum(h.usd for h in done), new)
            scheduler.save_exposure()
            line = (
                f"budget: released ${sum(h.usd for h in done):.4f} held for an earlier run's "
                f"requests; the provider billed ${new:.4f} beyond the ledger meanwhile"
            )
            console.print(line, markup=False, highlight=False)
            append_log(store.path.parent / "run.log", [line])


async def check_credit_floor(
    job: Job, accounts: list[Account], clients: Mapping[str, ChatClient]
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
        if await remaining_credit(clients[account.endpoints[0]]) is None:
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
    clients: Mapping[str, ChatClient],
    scheduler: Scheduler,
    stats: RunStats,
) -> None:
    """Keep the account's remaining credit in the stats; stop below the credit floor."""
    if not accounts:
        return
    floor = job.budget.stop_when_credits_below
    client = clients[accounts[0].endpoints[0]]

    def seen(credit: float) -> None:
        stats.credits_usd = credit
        if floor is not None and credit < floor:
            scheduler.stop(
                f"the account's credit (${credit:.4f}) is below "
                f"[budget].stop_when_credits_below = {floor:g}",
                budget=True,
            )

    await poll_credit(lambda: remaining_credit(client), job.budget.credit_poll_s, seen)


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
        notes.append(f"resuming with changed settings (--force): {'; '.join(changes)}")
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
    store.requeue_retryable_failures(RETRYABLE | STOPS_RUN)
    unassigned = store.assign_lanes(lane_rules(job))
    progress = store.dataset_progress()
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
        first = store.bad_rows(p.name, limit=3)
        source = store.dataset_source(p.name)
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
    try:
        with quiet_gc():
            done = asyncio.run(dispatch(job, store, keys, console, progress=prepared.progress))
        stop_reason, budget_stop = done.stats.stop_reason, done.stats.budget_stop
        reconciliations, budget_lines = done.reconciliations, done.budget_lines
        drained = done.stats.drained
    except (KeyboardInterrupt, asyncio.CancelledError):
        aborted, stop_reason = True, "interrupted"
    append_log(
        out / "run.log",
        budget_lines
        + [reconciliation_line(r) for r in reconciliations]
        + [drained_line(name, n) for name, n in drained.items()],
    )
    blocked = store.blocked_items()
    unproven = json.loads(store.get_meta("unproven_providers") or "[]")
    unsent = unsent_items(
        job,
        store,
        stop_reason=stop_reason,
        budget_stop=budget_stop,
        unassigned=unassigned,
        blocked=blocked,
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
        datasets=store.dataset_progress(),
        exports=exports,
        errors=store.failure_counts(),
        stop_reason=stop_reason,
        interrupted=stop_reason == "interrupted",
        aborted=aborted,
        unassigned=unassigned,
        blocked=blocked,
        reconciliations=reconciliations,
        budget_lines=budget_lines,
        budget_stop=budget_stop,
        drained=drained,
        counted_usage=store.usage_sources(),
        unsent=unsent,
        unproven=store.answers_by_provider(unproven),
    )
