"""Before a run sends anything: the job's fingerprint, its sources read, failed items
re-queued, lanes assigned, and where each dataset stands."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from regen import __version__
from regen.config import Job, fingerprint_changes
from regen.conversation import (
    canonical_json,
)
from regen.engine.client import RETRYABLE, STOPS_RUN
from regen.engine.failures import CLIENT_ERRORS
from regen.errors import ConfigError
from regen.events import fields
from regen.outputs.export import clean_stale_exports
from regen.run.budgets import budget_book
from regen.sources.ingest import ingest, lane_rules
from regen.state.db import Store
from regen.state.work import DatasetProgress
from regen.view.progress import dataset_start_line

log = logging.getLogger(__name__)

FORCED_NOTE = "resuming with changed settings (--force)"


@dataclass(frozen=True)
class Prepared:
    """Where the datasets stand as a run starts sending."""

    unassigned: dict[str, int]
    """Pending items no lane selects, by dataset."""
    progress: list[DatasetProgress]


def prepare(job: Job, store: Store, *, force: bool, stale_pid: int | None) -> Prepared:
    """Before sending: check the fingerprint, ingest, re-queue transient failures, assign
    lanes, and say where each dataset stands (events: `regen/events.py`)."""
    notes = check_samples(store, job) + check_fingerprint(store, job, force=force)
    notes += dialect_notes(job)
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
    samples = {d.name: job.dataset_samples(d) for d in job.datasets}
    for note in notes:
        log.info(note)
    for p in progress:
        line = dataset_start_line(p, met.get(p.name), samples.get(p.name, 1))
        done = {"done": p.done, "failed": p.failed, "pending": p.pending}
        log.info(line, extra=fields("dataset_start", dataset=p.name, items=p.items, **done))
    return Prepared(unassigned, progress)


def check_samples(store: Store, job: Job) -> list[str]:
    """Answers per prompt may grow (the next read adds the new samples' items) but never
    shrink: the items of the samples already asked for would still be sent. Recorded per
    dataset; returns notes for the ones that grew."""
    stored = json.loads(store.get_meta("samples") or "{}")
    now = {d.name: job.dataset_samples(d) for d in job.datasets}
    notes = []
    for name, k in now.items():
        before = int(stored.get(name, 1))
        if k < before:
            raise ConfigError(
                f"dataset {name}: samples went down from {before} to {k}: state.db already "
                f"holds {before} samples per prompt, and runs would keep sending them; set "
                f"samples = {before} again (`regen export --samples first` writes one per prompt)"
            )
        if k > before and name in stored:  # a dataset's first run grows nothing
            notes.append(f"dataset {name}: samples {before} -> {k}: adds {k - before} per prompt")
    store.set_meta("samples", json.dumps({**stored, **now}, sort_keys=True))
    return notes


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
        if e.kind.effort_only and reasoning and set(reasoning) - {"effort"}:
            notes.append(
                f"note: endpoint {e.name} ({e.dialect}) has no `reasoning` object: only its "
                "effort is sent (reasoning_effort); switch thinking with extra_body = "
                "{ chat_template_kwargs = { enable_thinking = false } } (Kimi: thinking)"
            )
    return notes
