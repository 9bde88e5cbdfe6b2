"""`regen run`: the whole flow for one job, from sources to exports, in one direction."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from regen import __version__
from regen.budget import (
    Account,
    Baseline,
    Reconciliation,
    billing_accounts,
    load_baseline,
    reconcile,
    save_baseline,
)
from regen.client import RETRYABLE, STOPS_RUN, ChatClient, Timeouts, chat_body
from regen.config import EndpointConfig, Job, fingerprint_changes
from regen.conversation import (
    BadRow,
    Request,
    canonical_json,
    conversation_id,
    estimate_prompt_tokens,
)
from regen.errors import ConfigError
from regen.export import export_specforge
from regen.lock import RunLock
from regen.modes import item_id, prompt_hash_of, target_turns
from regen.progress import (
    ProgressReporter,
    append_log,
    dataset_start_line,
    reconciliation_line,
)
from regen.scheduler import (
    DatasetStats,
    EndpointRuntime,
    LaneRuntime,
    RunStats,
    Scheduler,
    Sender,
)
from regen.sources import read_conversations
from regen.store import DatasetProgress, LaneRule, NewConversation, NewItem, Store

INGEST_BATCH = 1000
SELF_HOSTED = ("vllm", "sglang")


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
    reconciliations: list[Reconciliation] = field(default_factory=list)
    """Per billing account: spend since the job started, by the provider and by the ledger."""

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


def order_key(seed: int, iid: str) -> int:
    """Dispatch position: a seeded shuffle, so early results represent the whole dataset."""
    digest = hashlib.blake2b(f"{seed}:{iid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def ingest(store: Store, job: Job) -> None:
    """Read every dataset into the store; new rows add items, known rows change nothing."""
    for position, ds in enumerate(job.datasets):
        path = job.resolve(ds.path)
        store.register_dataset(ds.name, position, str(path))
        bad: list[BadRow] = []
        rows = turns_read = 0
        batch: list[NewConversation] = []
        for conv in read_conversations(ds.name, path, ds.format, ds.reader, ds.limit):
            rows += 1
            if isinstance(conv, BadRow):
                bad.append(conv)
                continue
            turns = target_turns(conv, ds.mode)
            if isinstance(turns, str):
                bad.append(BadRow(ds.name, conv.row_index, turns))
                continue
            # Serialize once: the id, prompt hashes and estimates all derive from it.
            data = conv.to_dict()
            text = canonical_json(data)
            cid = conversation_id(conv.dataset, text)
            items = []
            for t in turns:
                iid = item_id(cid, t)
                items.append(
                    NewItem(
                        iid,
                        t,
                        prompt_hash_of(data, t),
                        order_key(job.run.shuffle_seed, iid),
                        estimate_prompt_tokens(data, t),
                    )
                )
            turns_read += len(items)
            batch.append(NewConversation(cid, conv.dataset, conv.row_index, text, items))
            if len(batch) >= INGEST_BATCH:
                store.add_conversations(batch)
                batch = []
        if batch:
            store.add_conversations(batch)
        store.record_source_stats(ds.name, rows, turns_read, bad)


def lane_rules(job: Job) -> list[LaneRule]:
    return [
        LaneRule(lane.name, lane.datasets, lane.min_prompt_tokens, lane.max_prompt_tokens)
        for lane in job.lane_list
    ]


def _make_body(job: Job, endpoint: EndpointConfig) -> Callable[[Request, int], dict[str, Any]]:
    def make(req: Request, max_tokens: int) -> dict[str, Any]:
        return chat_body(req, job.generation, endpoint, max_tokens)

    return make


def build_lanes(job: Job, senders: Mapping[str, Sender]) -> list[LaneRuntime]:
    """The job's lanes, each with its endpoints (by name in `senders`) and settings."""
    runtimes = {
        e.name: EndpointRuntime(e.name, senders[e.name], _make_body(job, e), e.weight)
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
            ),
            endpoints=[runtimes[n] for n in lane.endpoints or list(runtimes)],
            datasets=[d for d in order if lane.datasets is None or d in lane.datasets],
            stream=lane.stream,
            escalate_to=lane.escalate_to,
        )
        for lane in job.lane_list
    ]


async def dispatch(
    job: Job, store: Store, keys: dict[str, str | None], console: Console
) -> tuple[RunStats, list[Reconciliation]]:
    """Send every pending item; returns the live stats, with the reason if the run stopped,
    and each billing account's spend as the provider and the ledger see it."""
    stats = RunStats(
        datasets={
            p.name: DatasetStats(items=p.items, done_before=p.done)
            for p in store.dataset_progress()
        }
    )
    lanes_cfg = job.lane_list
    pool_size: dict[str, int] = {}
    for lane in lanes_cfg:
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
        baselines = await take_baselines(store, accounts, clients)
        lanes = build_lanes(job, clients)
        scheduler = Scheduler(store, lanes, job.run, stats)
        reporter = ProgressReporter(
            stats, console, job.run.progress_interval_s, job.output_path / "run.log"
        )
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        signals = (signal.SIGINT, signal.SIGTERM)

        def on_signal() -> None:
            # First signal: stop dispatch, let in-flight requests finish. Second: abort now.
            if scheduler.stopping and main is not None:
                main.cancel()
            scheduler.stop("interrupted")

        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
        progress_task = asyncio.create_task(reporter.run())
        try:
            await scheduler.run()
        finally:
            progress_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress_task
            for sig in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        reconciliations = []
        for account in accounts:
            baseline = baselines.get(account.key)
            usage = await clients[account.endpoints[0]].key_usage()
            if baseline is not None and usage is not None:
                ledger = store.ledger_usd(account.endpoints)
                reconciliations.append(reconcile(account, baseline, usage, ledger))
    return stats, reconciliations


async def take_baselines(
    store: Store, accounts: list[Account], clients: Mapping[str, ChatClient]
) -> dict[str, Baseline]:
    """Each account's baseline: stored by the job's first run, else read now, before any
    request of this run is sent. An account whose usage cannot be read has none."""
    out: dict[str, Baseline] = {}
    for account in accounts:
        baseline = load_baseline(store, account)
        if baseline is None:
            usage = await clients[account.endpoints[0]].key_usage()
            if usage is None:
                continue
            baseline = Baseline(usage, store.ledger_usd(account.endpoints))
            save_baseline(store, account, baseline)
        out[account.key] = baseline
    return out


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


def run_job(
    job: Job, *, console: Console, api_key: str | None = None, force: bool = False
) -> RunReport:
    """Ingest, dispatch, export and report. `api_key` defaults to the job's env variable;
    `force` resumes even if the job's data-affecting settings changed."""
    keys = {
        e.name: api_key if api_key is not None else api_key_from_env(e) for e in job.endpoint_pool
    }
    out = job.output_path
    with RunLock(out) as lock:
        store = Store.open(out)
        try:
            return _run_locked(job, store, keys, console, force, lock.stale_pid)
        finally:
            store.close()


def _run_locked(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    console: Console,
    force: bool,
    stale_pid: int | None,
) -> RunReport:
    out = job.output_path
    notes = check_fingerprint(store, job, force=force)
    if stale_pid is not None:
        notes.insert(0, f"took over the lock of pid {stale_pid}, which ended without releasing it")
    ingest(store, job)
    store.requeue_retryable_failures(RETRYABLE | STOPS_RUN)
    unassigned = {
        ds: n for (lane, ds), n in store.assign_lanes(lane_rules(job)).items() if lane is None
    }
    lines = notes + [dataset_start_line(p) for p in store.dataset_progress()]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    append_log(out / "run.log", lines)
    aborted = False
    reconciliations: list[Reconciliation] = []
    try:
        stats, reconciliations = asyncio.run(dispatch(job, store, keys, console))
        stop_reason = stats.stop_reason
    except (KeyboardInterrupt, asyncio.CancelledError):
        aborted, stop_reason = True, "interrupted"
    append_log(out / "run.log", [reconciliation_line(r) for r in reconciliations])
    names = [d.name for d in job.datasets]
    exports = export_specforge(store, names, out / "export")
    return RunReport(
        out_dir=out,
        datasets=store.dataset_progress(),
        exports=exports,
        errors=store.failure_counts(),
        stop_reason=stop_reason,
        interrupted=stop_reason == "interrupted",
        aborted=aborted,
        unassigned=unassigned,
        reconciliations=reconciliations,
    )
