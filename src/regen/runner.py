"""`regen run`: the whole flow for one job, from sources to exports, in one direction."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from regen import __version__
from regen.client import RETRYABLE, STOPS_RUN, ChatClient, chat_body
from regen.config import Job
from regen.conversation import BadRow, Conversation, Request
from regen.errors import ConfigError
from regen.export import export_specforge
from regen.modes import item_id, prompt_hash, target_turns
from regen.progress import ProgressReporter
from regen.scheduler import DatasetStats, RunStats, Scheduler
from regen.sources import read_conversations
from regen.store import DatasetProgress, NewItem, Store

INGEST_BATCH = 1000
SELF_HOSTED = ("vllm", "sglang")


@dataclass(frozen=True)
class IngestReport:
    dataset: str
    rows: int
    bad: int
    new_items: int


@dataclass
class RunReport:
    """What a finished (or stopped) run did; everything in it was read back from state.db."""

    out_dir: Path
    datasets: list[DatasetProgress]
    exports: dict[str, int]
    errors: dict[tuple[str, str], int]
    ingest: list[IngestReport] = field(default_factory=list)
    stop_reason: str | None = None
    interrupted: bool = False

    @property
    def failed(self) -> int:
        return sum(d.failed for d in self.datasets)


def api_key_from_env(job: Job) -> str | None:
    """The key from the variable that the job names; self-hosted servers may need none."""
    name = job.endpoint.api_key_env
    key = os.environ.get(name, "").strip()
    if not key and job.endpoint.dialect not in SELF_HOSTED:
        raise ConfigError(f"set {name} or name another variable in [endpoint].api_key_env")
    return key or None


def order_key(seed: int, iid: str) -> int:
    """Dispatch position: a seeded shuffle, so early results represent the whole dataset."""
    digest = hashlib.blake2b(f"{seed}:{iid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def ingest(store: Store, job: Job) -> list[IngestReport]:
    """Read every dataset into the store; new rows add items, known rows change nothing."""
    reports = []
    for position, ds in enumerate(job.datasets):
        path = job.resolve(ds.path)
        store.register_dataset(ds.name, position, str(path))
        bad: list[BadRow] = []
        rows = new = turns_read = 0
        batch: list[tuple[Conversation, list[NewItem]]] = []
        for conv in read_conversations(ds.name, path, ds.format, ds.reader, ds.limit):
            rows += 1
            if isinstance(conv, BadRow):
                bad.append(conv)
                continue
            turns = target_turns(conv, ds.mode)
            if isinstance(turns, str):
                bad.append(BadRow(ds.name, conv.row_index, turns))
                continue
            cid = conv.id
            items = []
            for t in turns:
                iid = item_id(cid, t)
                items.append(
                    NewItem(iid, t, prompt_hash(conv, t), order_key(job.run.shuffle_seed, iid))
                )
            turns_read += len(items)
            batch.append((conv, items))
            if len(batch) >= INGEST_BATCH:
                new += store.add_conversations(batch)
                batch = []
        if batch:
            new += store.add_conversations(batch)
        store.record_source_stats(ds.name, rows, turns_read, bad)
        reports.append(IngestReport(ds.name, rows, len(bad), new))
    return reports


async def dispatch(job: Job, store: Store, api_key: str | None, console: Console) -> RunStats:
    """Send every pending item; returns the live stats, with the reason if the run stopped."""
    stats = RunStats(
        datasets={
            p.name: DatasetStats(items=p.items, done_before=p.done)
            for p in store.dataset_progress()
        }
    )
    names = [d.name for d in job.datasets]
    client = ChatClient(
        job.endpoint.base_url,
        api_key,
        concurrency=job.run.concurrency,
        timeout_s=job.run.timeout_s,
        connect_timeout_s=job.run.connect_timeout_s,
        headers=job.endpoint.headers,
    )

    def make_body(req: Request) -> dict[str, object]:
        return chat_body(req, job.generation, job.endpoint)

    async with client:
        scheduler = Scheduler(store, client, make_body, names, job.run, stats)
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
    return stats


def run_job(job: Job, *, console: Console, api_key: str | None = None) -> RunReport:
    """Ingest, dispatch, export and report. `api_key` defaults to the job's env variable."""
    key = api_key if api_key is not None else api_key_from_env(job)
    out = job.output_path
    store = Store.open(out)
    try:
        if store.get_meta("fingerprint") is None:
            store.set_meta("fingerprint", job.fingerprint())
            store.set_meta("regen_version", __version__)
        reports = ingest(store, job)
        store.requeue_retryable_failures(RETRYABLE | STOPS_RUN)
        interrupted = False
        try:
            stats = asyncio.run(dispatch(job, store, key, console))
            stop_reason = stats.stop_reason
        except (KeyboardInterrupt, asyncio.CancelledError):
            interrupted, stop_reason = True, "interrupted"
        names = [d.name for d in job.datasets]
        exports = export_specforge(store, names, out / "export")
        return RunReport(
            out_dir=out,
            datasets=store.dataset_progress(),
            exports=exports,
            errors=store.failure_counts(),
            ingest=reports,
            stop_reason=stop_reason,
            interrupted=interrupted or stop_reason == "interrupted",
        )
    finally:
        store.close()
