"""What a run says at its end: its report, the items it left unsent and why, and the
lines that explain the rest."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from regen.config import Job
from regen.engine.billing import (
    Reconciliation,
)
from regen.engine.budget import BudgetBook
from regen.engine.stats import RunStats
from regen.run.budgets import budget_book
from regen.safe import printable
from regen.state.db import Store
from regen.state.runs import OutageRecord
from regen.state.sources import BadRowGroup
from regen.state.spend import EndpointTotals
from regen.state.work import DatasetProgress
from regen.view.progress import outages_line


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
    outages: dict[str, list[OutageRecord]] = field(default_factory=dict)
    """Per endpoint of a pool: each time it was taken out (its server down or loading)."""
    endpoints: list[EndpointTotals] = field(default_factory=list)
    """Per endpoint of a pool of several: what it answered and failed, for the job."""
    counted_usage: dict[tuple[str, str], int] = field(default_factory=dict)
    """Answers whose server sent no usage, by (dataset, `ids` or `estimate`)."""
    unsent: list[Unsent] = field(default_factory=list)
    """The items left pending at the end, by dataset and why."""
    unproven: dict[str, int] = field(default_factory=dict)
    """Answers per provider name that an allowed and an excluded endpoint share."""
    export_left_out: dict[str, int] = field(default_factory=dict)
    """Answers per dataset left out of the run's export (their history holds the dataset's
    own assistant turns)."""
    row_notes: list[BadRowGroup] = field(default_factory=list)
    """What the reads noticed in rows they used (modes.row_notes), commonest first."""

    @property
    def failed(self) -> int:
        return sum(d.failed for d in self.datasets)


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
        elif state.met is not None and state.held_out:
            out.append(Unsent(p.name, n, state.met, "cap"))
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


def unproven_line(provider: str, answers: int) -> str:
    return (
        f"{answers} answers came from {provider}, which also serves from an endpoint the job "
        "excludes: an answer names only its provider, so these cannot be proven to come from "
        "an allowed one (see `regen providers MODEL --job JOB.toml` for a quantizations "
        "allow-list that keeps the excluded one out)"
    )


def unsent_line(u: Unsent) -> str:
    return f"dataset {u.dataset}: {u.items} items not sent: {u.reason}"


def counted_usage_line(dataset: str, source: str, n: int) -> str:
    if source == "worst":
        return (
            f"dataset {dataset}: {n} answers came with usage regen did not believe (the gate's "
            "lines say which field): kept, flagged (usage_source 'worst' in the exports), and "
            "charged their worst cases"
        )
    how = (
        "counted from the token ids it returned"
        if source == "ids"
        else "estimated from their text (about 4 bytes a token; budgets and prices use it)"
    )
    return f"dataset {dataset}: {n} answers came without usage from the server: {how}"


def left_out_line(dataset: str, n: int) -> str:
    return (
        f"export: {n} answer(s) of {dataset} left out of export/{dataset}.jsonl: their history "
        "holds the dataset's own assistant turns, which SpecForge would train on; `regen export "
        "--format specforge --family F` writes them with exact loss masks (or --format openai, "
        "or tokenized)"
    )


def orphans_line(dataset: str, n: int, out_dir: Path) -> str:
    return (
        f"export: {n} answer(s) of {dataset} left out: their rows are no longer in its source "
        f"as last read; state.db keeps them (`regen export {out_dir} --keep-orphans` writes "
        "them)"
    )


def row_note_line(g: BadRowGroup) -> str:
    first = ", ".join(map(str, g.first_rows)) + (", ..." if g.rows > len(g.first_rows) else "")
    return f"note: dataset {g.dataset}: {g.rows} row(s) (rows {first}): {g.example}"


def run_outages(stats: RunStats) -> dict[str, list[OutageRecord]]:
    """This run's outages per endpoint (the run's id is not needed to say them); a dropped
    connection with the server back at its first probe is none (OutageRecord.is_outage)."""
    out: dict[str, list[OutageRecord]] = {}
    for name, ep in stats.endpoints.items():
        records = [OutageRecord(0, name, o.start, o.end, o.resent) for o in ep.outages]
        if kept := [o for o in records if o.is_outage]:
            out[name] = kept
    return out


@dataclass(frozen=True)
class Ended:
    """How a run ended, for its exit code (`cli.py` maps `kind` to one) and the lines that
    say why: `aborted`, `cap` (the job's dollar cap or the credit floor), `left` (items the
    next run sends), `error` (said on stderr), `failed` (finished with failed items), `done`."""

    kind: str
    lines: list[str] = field(default_factory=list)
    error: str | None = None


def how_it_ended(report: RunReport) -> Ended:
    """The run's ending, from its report."""
    left = sum(u.items for u in report.unsent if u.kind == "left")
    capped = sum(u.items for u in report.unsent if u.kind == "cap")
    stopped = f"stopped: {printable(str(report.stop_reason))}"
    if report.aborted:
        again = "run the same command again to resume"
        return Ended("aborted", [f"aborted: requests in flight were cut short; {again}"])
    if report.interrupted:
        # Everything that finished is kept; what is left is said, and so is the exit code.
        line = "stopped: interrupted; run the same command again to resume"
        return Ended("left" if left else "done", [line])
    lines = []
    if report.budget_stop:
        lines.append(stopped)
        if capped:
            return Ended("cap", lines)
    elif capped and not report.outage and not report.stop_reason:
        # A dataset's limit held by a killed run's requests: the job cap's words and code.
        return Ended("cap")
    elif report.outage:
        return Ended("left", [stopped])
    elif report.stop_reason:
        return Ended("error", error=f"error: run stopped: {printable(str(report.stop_reason))}")
    if left:
        lines.append(f"{left} items were not sent (above): run the same command again to send them")
        return Ended("left", lines)
    return Ended("failed" if report.failed else "done", lines)


def money_lines(report: RunReport) -> list[str]:
    """The budgets' lines, then each account's spend against the ledger."""
    return [*report.budget_lines, *map(spend_line, report.reconciliations)]


def note_lines(report: RunReport) -> list[str]:
    """What the run wants said under its tables: outages, usage counted by regen, answers
    without proof, row notes, rows left out of exports, orphans, and what was not sent."""
    now = time.time()
    still_out = "still out at the end, since"
    return [
        *(outages_line(n, o, now=now, still_out=still_out) for n, o in report.outages.items()),
        *(counted_usage_line(ds, src, n) for (ds, src), n in sorted(report.counted_usage.items())),
        *(unproven_line(p, answers) for p, answers in sorted(report.unproven.items())),
        *map(row_note_line, report.row_notes),
        *(left_out_line(ds, n) for ds, n in sorted(report.export_left_out.items())),
        *(orphans_line(d.name, d.orphans, report.out_dir) for d in report.datasets if d.orphans),
        *map(unsent_line, report.unsent),
    ]


def spend_line(r: Reconciliation) -> str:
    """One account's spend since the job started, by the provider and by the ledger."""
    source = (
        "the keys made for the job"
        if r.account.management_key_env is not None
        else f"{r.account.base_url}/key"
    )
    head = (
        f"spend since the job started: ledger ${r.ledger_usd:.4f}, "
        f"provider ${r.provider_usd:.4f} ({source})"
    )
    if r.agrees():
        return f"{head}: they agree (difference ${abs(r.difference_usd):.8f})"
    if r.difference_usd > 0:
        return (
            f"{head}: ${r.difference_usd:.8f} billed on the key beyond this job's ledger "
            "(other jobs or clients using the same key, or requests of this job whose bills "
            "regen never saw); it does not count against this job's caps"
        )
    return f"{head}: the ledger is ${-r.difference_usd:.8f} above the provider's usage"
