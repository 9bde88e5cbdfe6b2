"""What a person watching a run sees: a live table on a TTY, plain greppable lines otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from regen.billing import Reconciliation
from regen.errors import StateError
from regen.eta import Eta, eta_text, format_duration
from regen.forecast import Estimate
from regen.scheduler import DatasetStats, RunStats
from regen.store import BadRowGroup, DatasetProgress


def log_stamp() -> str:
    """The UTC time that starts every line of run.log."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def append_log(path: Path, lines: list[str]) -> None:
    """Add time-stamped lines to run.log."""
    if not lines:
        return
    stamp = log_stamp()
    try:
        with path.open("a", encoding="utf-8") as f:
            f.writelines(f"{stamp} {line}\n" for line in lines)
    except OSError as exc:
        raise StateError(f"{path}: cannot write: {exc}") from exc


def dataset_start_line(p: DatasetProgress, budget_met: str | None = None) -> str:
    """Where a dataset stands as a run starts: `complete`, `skipped (budget met)`, `resuming
    from N of M` or `new`."""
    finished = p.done + p.failed
    if budget_met is not None and p.pending:
        state = f"skipped (budget met): {budget_met}, {finished} of {p.items} done"
    elif p.items == 0:
        state = "nothing to send (no usable rows)"
    elif p.pending == 0:
        state = "complete" + (f" ({p.failed} failed)" if p.failed else "")
    elif finished == 0:
        state = f"new, {p.items} items"
    else:
        state = f"resuming from {finished} of {p.items}"
    return f"dataset {p.name}: {state}"


def reconciliation_line(r: Reconciliation) -> str:
    """`reconcile` key=value line: provider-billed spend against the ledger's, since the job
    started, for one account."""
    return (
        f"reconcile account={r.account.base_url} provider_usd={r.provider_usd:.8f} "
        f"ledger_usd={r.ledger_usd:.8f} difference_usd={r.difference_usd:.8f}"
    )


def format_tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 10_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def errors_text(counter: dict[str, int]) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted(counter.items())) or "0"


def _totals(stats: RunStats) -> DatasetStats:
    """The job as a whole: every dataset's counters added up."""
    total = DatasetStats()
    for d in stats.datasets.values():
        total.items += d.items
        total.done_before += d.done_before
        total.done += d.done
        total.failed += d.failed
        total.in_flight += d.in_flight
        total.prompt_tokens += d.prompt_tokens
        total.completion_tokens += d.completion_tokens
        total.cost_usd += d.cost_usd
        total.errors.update(d.errors)
    return total


def per_mtok(cost_usd: float, completion_tokens: int) -> float:
    """Effective dollars per million completion tokens (everything spent, over what came)."""
    return cost_usd / completion_tokens * 1e6 if completion_tokens else 0.0


def _eta_fields(eta: Eta | None) -> str:
    if eta is None:
        return "eta_s=- eta_p10_s=- eta_p90_s=-"
    return f"eta_s={eta.seconds:.0f} eta_p10_s={eta.p10:.0f} eta_p90_s={eta.p90:.0f}" + (
        " eta_bound=budget" if eta.bound == "budget" else ""
    )


def progress_line(stats: RunStats, now: float | None = None) -> str:
    """One stable `key=value` line for logs and `tail -f` over SSH."""
    now = time.monotonic() if now is None else now
    elapsed = max(now - stats.started_at, 1e-9)
    t = _totals(stats)
    rates = stats.rolling(now)
    _, job_eta = stats.etas(now)
    per_ds = " ".join(
        f"{name}={d.done_before + d.done}/{d.items}" for name, d in stats.datasets.items()
    )
    per_lane = " ".join(
        f"lane_{name}={lane.in_flight}/{lane.limit}/{lane.concurrency}"
        for name, lane in stats.lanes.items()
    )
    stamp = log_stamp()
    return (
        f"{stamp} progress done={t.done_before + t.done}/{t.items} failed={t.failed} "
        f"in_flight={t.in_flight} req_s={t.done / elapsed:.2f} req_s_1m={rates[''][0]:.2f} "
        f"out_tok_s={t.completion_tokens / elapsed:.0f} out_tok_s_1m={rates[''][1]:.0f} "
        f"{_eta_fields(job_eta)} completion_tokens={t.completion_tokens} "
        f"cost_usd={t.cost_usd:.4f} usd_per_mtok={per_mtok(t.cost_usd, t.completion_tokens):.2f} "
        + (f"credits_usd={stats.credits_usd:.4f} " if stats.credits_usd is not None else "")
        + f"errors={errors_text(t.errors)} "
        f"elapsed_s={elapsed:.0f} {per_ds} {per_lane}"
    ).rstrip()


def _table_cells(
    name: str, d: DatasetStats, rate: tuple[float, float], eta: Eta | None
) -> tuple[str, ...]:
    used = format_tokens(d.completion_tokens)
    if d.token_budget is not None:
        used += f"/{format_tokens(d.token_budget)}"
    return (
        name,
        f"{d.done_before + d.done}/{d.items}",
        str(d.failed),
        str(d.in_flight),
        f"{rate[0]:.1f}",
        format_tokens(round(rate[1])),
        used,
        f"{d.completion_tokens / d.done:.0f}" if d.done else "-",
        f"{d.cost_usd:.4f}",
        f"{per_mtok(d.cost_usd, d.completion_tokens):.2f}",
        errors_text(d.errors),
        eta_text(eta),
    )


def progress_table(stats: RunStats, now: float | None = None) -> Table:
    now = time.monotonic() if now is None else now
    elapsed = max(now - stats.started_at, 1e-9)
    rates = stats.rolling(now)
    etas, job_eta = stats.etas(now)
    t = _totals(stats)
    title = (
        f"regen  {format_duration(elapsed)} elapsed  ETA {eta_text(job_eta)}  "
        f"{t.done / elapsed:.1f} req/s overall  ${t.cost_usd:,.4f} spent"
    )
    if stats.credits_usd is not None:
        title += f"  ${stats.credits_usd:,.2f} credit left"
    table = Table(title=title, title_justify="left", expand=False)
    cols = (
        "dataset",
        "done/total",
        "failed",
        "in flight",
        "req/s 1m",
        "tok/s 1m",
        "tokens/budget",
        "mean len",
        "$",
        "$/Mtok",
        "errors",
        "ETA (p10-p90)",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("dataset", "errors") else "right")
    for name, d in stats.datasets.items():
        table.add_row(*_table_cells(name, d, rates[name], etas.get(name)))
    if len(stats.datasets) > 1:
        table.add_section()
        table.add_row(*_table_cells("total", t, rates[""], job_eta), style="bold")
    table.add_section()
    for name, lane in stats.lanes.items():
        c, _ = lane.wire.mean(now)
        table.add_row(
            f"lane {name}",
            f"{lane.done} done",
            f"{lane.escalated} escalated" if lane.escalated else "",
            str(lane.in_flight),
            f"limit {lane.limit}/{lane.concurrency}",
            f"mean {c:.0f} on wire",
            style="dim",
        )
    return table


class ProgressReporter:
    """Shows progress until cancelled: live on a TTY, a line every `interval_s` otherwise.

    Every line also goes to `log_path` (run.log), whatever stdout is.
    """

    def __init__(
        self, stats: RunStats, console: Console, interval_s: float, log_path: Path | None
    ) -> None:
        self._stats = stats
        self._console = console
        self._interval_s = interval_s
        self._log_path = log_path
        self._log_file: TextIO | None = None

    def _log(self, line: str) -> None:
        if self._log_file is None:
            return
        try:
            self._log_file.write(line + "\n")
            self._log_file.flush()
        except OSError as exc:
            # A full disk must not end the run over its log: say so once, keep showing progress.
            self._close_log()
            self._console.print(
                f"warning: {self._log_path}: cannot write progress lines: {exc}", markup=False
            )

    def _close_log(self) -> None:
        log, self._log_file = self._log_file, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()

    async def run(self) -> None:
        if self._log_path is not None:
            try:
                self._log_file = self._log_path.open("a", encoding="utf-8")
            except OSError as exc:
                self._console.print(f"warning: {self._log_path}: {exc}", markup=False)
        live: Live | None = None
        try:
            if self._console.is_terminal:
                live = Live(
                    progress_table(self._stats),
                    console=self._console,
                    refresh_per_second=4,
                    transient=False,
                )
                live.start()
            last_line = 0.0
            while True:
                now = time.monotonic()
                if live is not None:
                    live.update(progress_table(self._stats, now))
                if now - last_line >= self._interval_s:
                    line = progress_line(self._stats, now)
                    self._log(line)
                    if live is None:
                        self._console.print(line, markup=False, highlight=False, soft_wrap=True)
                    last_line = now
                await asyncio.sleep(0.25 if live is not None else min(self._interval_s, 1.0))
        finally:
            final = progress_line(self._stats)
            self._log(final)
            if live is not None:
                live.update(progress_table(self._stats))
                live.stop()
            else:
                self._console.print(final, markup=False, highlight=False, soft_wrap=True)
            self._close_log()


def summary_table(
    datasets: list[DatasetProgress], errors: dict[tuple[str, str], int], exports: dict[str, int]
) -> Table:
    """The end-of-run table: per dataset, what is done and what it cost (from state.db)."""
    table = Table(title="summary", title_justify="left")
    cols = (
        "dataset",
        "rows",
        "bad",
        "dupes",
        "items",
        "done",
        "failed",
        "prompt tok",
        "completion tok",
        "cost $",
        "$/Mtok",
        "errors",
        "exported",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("dataset", "errors") else "right")
    for d in datasets:
        errs = {c: n for (ds, c), n in errors.items() if ds == d.name}
        usd_per_mtok = per_mtok(d.cost_usd, d.completion_tokens)
        table.add_row(
            d.name,
            str(d.rows_read),
            str(d.bad_rows),
            str(d.duplicates),
            str(d.items),
            str(d.done),
            str(d.failed),
            format_tokens(d.prompt_tokens),
            format_tokens(d.completion_tokens),
            f"{d.cost_usd:.4f}",
            f"{usd_per_mtok:.2f}",
            errors_text(errs),
            str(exports.get(d.name, 0)),
        )
    return table


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def plan_table(estimates: list[Estimate]) -> Table:
    """`regen plan`: per dataset, what is still to come, and what the estimate rests on."""
    table = Table(title="plan (expected from here)", title_justify="left")
    cols = ("dataset", "items", "pending", "to send", "completion tok", "prompt tok", "cost $")
    for col in (*cols, "time", "from", "budget"):
        table.add_column(col, justify="left" if col in ("dataset", "from", "budget") else "right")
    for e in estimates:
        table.add_row(
            e.name,
            str(e.items),
            str(e.pending),
            str(e.sent),
            format_tokens(round(e.completion_tokens)),
            format_tokens(round(e.prompt_tokens)),
            "?" if e.cost_usd is None else f"{e.cost_usd:.4f}",
            _duration(e.time_s),
            e.basis,
            e.budget_note or "",
        )
    if len(estimates) > 1:
        costs = [e.cost_usd for e in estimates]
        table.add_section()
        table.add_row(
            "total",
            str(sum(e.items for e in estimates)),
            str(sum(e.pending for e in estimates)),
            str(sum(e.sent for e in estimates)),
            format_tokens(round(sum(e.completion_tokens for e in estimates))),
            format_tokens(round(sum(e.prompt_tokens for e in estimates))),
            "?" if None in costs else f"{sum(c or 0.0 for c in costs):.4f}",
            _duration(_lanes_time(estimates)),
            "",
            "",
            style="bold",
        )
    return table


def _lanes_time(estimates: list[Estimate]) -> float | None:
    """Lanes run side by side, each through its datasets in turn."""
    per_lane: dict[str | None, float] = {}
    for e in estimates:
        if e.time_s is None:
            return None
        per_lane[e.lane] = per_lane.get(e.lane, 0.0) + e.time_s
    return max(per_lane.values(), default=0.0)


def bad_rows_table(groups: list[BadRowGroup]) -> Table:
    """Why rows were not used, commonest first: each reason as its first row had it, and the
    rows to look at (counted from 0 in the source)."""
    table = Table(title="rows not used (row numbers count from 0)", title_justify="left")
    for col in ("rows", "dataset", "source", "first rows", "reason (of the first)"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for g in groups:
        first = ", ".join(map(str, g.first_rows)) + (", ..." if g.rows > len(g.first_rows) else "")
        table.add_row(str(g.rows), g.dataset, g.source, first, g.example)
    return table
