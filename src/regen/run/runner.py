"""`regen run`: the whole flow for one job, from sources to exports, in one direction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from regen.config import Job
from regen.engine.billing import Reconciliation
from regen.errors import Interrupted
from regen.events import fields, listening
from regen.lock import LOCK_FILE, RunLock
from regen.outputs.export import export_specforge
from regen.run.accounts import endpoint_keys
from regen.run.dispatch import Dispatched, dispatch, quiet_gc
from regen.run.prepare import Prepared, prepare
from regen.run.signals import StopSignals, stop_signals
from regen.run.summary import RunReport, run_outages, unsent_items, unsent_line
from regen.safe import confined
from regen.state.db import PAST_JOB_SIGNS, STATE_FILES, Store
from regen.state.runs import OutageRecord
from regen.view.events import RunLogListener
from regen.view.progress import Shown, outages_line, reconciliation_line

log = logging.getLogger(__name__)


def run_job(
    job: Job, *, shown: Shown = None, api_key: str | None = None, force: bool = False
) -> RunReport:
    """Run the job, stage by stage, each stage's result handed down to the next: lock the
    output directory, open its state, prepare (fingerprint, sources, re-queued failures, lanes),
    dispatch (budgets, sending, reconciliation), then end (what is left unsent and why, the
    exports; the command writes report.html once it knows the exit code). `api_key` defaults
    to the job's env variable; `force` resumes even if the job's data-affecting settings
    changed. What it says goes out as events (`regen/events.py`), kept in run.log here;
    `shown` is how its progress is shown (view/progress.py's Watch; nowhere without one)."""
    keys = endpoint_keys(job, api_key)
    refuse_links_out(job)
    with stop_signals() as signals, RunLock(job.output_path) as lock, run_log_kept(job):
        store = Store.open(job.output_path)
        try:
            prepared = prepare(job, store, force=force, stale_pid=lock.stale_pid)
            dispatched = send(job, store, keys, shown, prepared, signals)
            return end(job, store, prepared, dispatched)
        finally:
            store.close()


@contextlib.contextmanager
def run_log_kept(job: Job) -> Iterator[None]:
    """run.log in the job's output directory as a listener of the run's events while the
    block runs (the run's record, whoever watches or not)."""
    with listening(RunLogListener(job.output_path / "run.log")):
        yield


def refuse_links_out(job: Job) -> None:
    """Every path a run writes or deletes in its output directory (the lock, state.db and its
    files, run.log, report.html, export/ and the export's files), checked before the run
    touches any: a link among them that leads out of the directory refuses the run before a
    request is sent or paid for. Each writer checks its own path again when it writes."""
    out = job.output_path
    names = [LOCK_FILE, *STATE_FILES, *PAST_JOB_SIGNS]
    for d in job.datasets:
        names += [f"export/{d.name}.jsonl", f"export/.{d.name}.jsonl.tmp"]
    for name in names:
        confined(out, out / name)


def send(
    job: Job,
    store: Store,
    keys: dict[str, str | None],
    shown: Shown,
    prepared: Prepared,
    signals: StopSignals,
) -> Dispatched | None:
    """Dispatch with the collector quiet; None when a Ctrl-C cut it short. Until the
    scheduler binds its own stop (`supervise`), a signal only says that nothing more is sent:
    the scheduler then stops as it starts."""

    async def sending() -> Dispatched:
        main = asyncio.current_task()
        assert main is not None

        def say(line: str) -> None:
            log.info(line)

        def stop(name: str) -> None:
            say(f"stopping: {name}: no request is sent after this (Ctrl-C again aborts at once)")

        def cut() -> None:
            say("stopping now (Ctrl-C again): the run ends at once")
            main.cancel()

        with signals.sending(stop=stop, cut=cut, say=say):
            return await dispatch(job, store, keys, shown, progress=prepared.progress)

    try:
        with quiet_gc():
            return asyncio.run(sending())
    except Interrupted:
        raise  # before the loop ran: nothing was sent, and the run stops where it is
    except (KeyboardInterrupt, asyncio.CancelledError):
        return None
    finally:
        signals.ending()


def end(
    job: Job,
    store: Store,
    prepared: Prepared,
    dispatched: Dispatched | None,
) -> RunReport:
    """Log how the sending ended, name what is left unsent and why, write the exports, and sum
    it all up (`dispatched` None: aborted)."""
    out = job.output_path
    ending = Ending.of(dispatched)
    log_ending(ending)
    blocked = store.work.blocked_items()
    unproven = json.loads(store.get_meta("unproven_providers") or "[]")
    unsent = unsent_items(
        job,
        store,
        stop_reason=ending.stop_reason,
        budget_stop=ending.budget_stop,
        unassigned=prepared.unassigned,
        blocked=blocked,
        book=dispatched.book if dispatched is not None else None,
    )
    for u in unsent:
        if u.kind != "budget":  # a dataset whose own budget is met is done, not left
            about = {"dataset": u.dataset, "items": u.items, "reason": u.reason, "kind": u.kind}
            log.debug(unsent_line(u), extra=fields("unsent", **about))
    exports, left_out = export_specforge(store, [d.name for d in job.datasets], out / "export")
    # report.html is written by the command once the run's exit code is known (it shows it).
    return RunReport(
        out_dir=out,
        datasets=store.work.dataset_progress(),
        exports=exports,
        errors=store.spend.failure_counts(),
        stop_reason=ending.stop_reason,
        interrupted=ending.stop_reason == "interrupted",
        aborted=dispatched is None,
        unassigned=prepared.unassigned,
        blocked=blocked,
        reconciliations=ending.reconciliations,
        budget_lines=ending.budget_lines,
        budget_stop=ending.budget_stop,
        outage=ending.outage,
        outages=ending.outages,
        endpoints=store.spend.by_endpoint() if len(job.endpoint_pool) > 1 else [],
        counted_usage=store.answers.usage_sources(),
        unsent=unsent,
        unproven=store.answers.answers_by_provider(unproven),
        row_notes=store.sources.bad_row_reasons(limit=5, table="row_notes"),
        export_left_out=left_out,
    )


@dataclass(frozen=True)
class Ending:
    """How the sending ended, as dispatch left it (an aborted run: interrupted, nothing
    reconciled)."""

    stop_reason: str | None
    budget_stop: bool
    outage: bool
    outages: dict[str, list[OutageRecord]]
    reconciliations: list[Reconciliation]
    budget_lines: list[str]

    @classmethod
    def of(cls, dispatched: Dispatched | None) -> Ending:
        """The ending of a dispatch (None: aborted)."""
        stats = dispatched.stats if dispatched is not None else None
        return cls(
            stop_reason=stats.stop_reason if stats is not None else "interrupted",
            budget_stop=stats.budget_stop if stats is not None else False,
            outage=stats.outage if stats is not None else False,
            outages=run_outages(stats) if stats is not None else {},
            reconciliations=dispatched.reconciliations if dispatched is not None else [],
            budget_lines=dispatched.budget_lines if dispatched is not None else [],
        )


def log_ending(ending: Ending) -> None:
    """Keep the budgets' lines, the accounts' reconciliations and the endpoints still out in
    run.log (the terminal shows them in the summary instead)."""
    now = time.time()
    for line in ending.budget_lines:
        log.debug(line)
    for r in ending.reconciliations:
        spend = {"provider_usd": r.provider_usd, "ledger_usd": r.ledger_usd}
        about = fields("reconcile", account=r.account.base_url, **spend)
        log.debug(reconciliation_line(r), extra=about)
    for name, o in ending.outages.items():
        log.debug(outages_line(name, o, now=now, still_out="still out at the end, since"))
