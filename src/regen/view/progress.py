"""What a person watching a run sees: a live view on a TTY that fits the terminal's width
(ProgressView, DEGRADE_ORDER), plain greppable lines otherwise (`progress_line`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from regen.engine.billing import Reconciliation
from regen.engine.budget import per_mtok
from regen.engine.eta import Eta, eta_text, format_duration
from regen.engine.holds import HoldSummary
from regen.engine.stats import DatasetStats, EndpointStats, RunStats
from regen.errors import StateError
from regen.safe import append, printable
from regen.state.runs import OutageRecord
from regen.state.sources import BadRowGroup
from regen.state.spend import EndpointTotals
from regen.state.work import DatasetProgress


def log_stamp() -> str:
    """The UTC time that starts every line of run.log."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunLog:
    """run.log's one writer: every line that reaches the file goes through `write`, which
    makes it one line with keys redacted and escapes shown (a line may quote a server or a
    dataset); the file is opened only once known not to lead out of the output directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: TextIO | None = append(path.parent, path)
        except OSError as exc:
            raise StateError(f"{path}: cannot write: {exc}") from exc

    def write(self, line: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(printable(line) + "\n")
            self._file.flush()
        except OSError as exc:
            raise StateError(f"{self.path}: cannot write: {exc}") from exc

    def close(self) -> None:
        log, self._file = self._file, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()


def append_log(path: Path, lines: list[str]) -> None:
    """Add time-stamped lines to run.log."""
    if not lines:
        return
    stamp = log_stamp()
    log = RunLog(path)
    try:
        for line in lines:
            log.write(f"{stamp} {line}")
    finally:
        log.close()


def dataset_start_line(p: DatasetProgress, budget_met: str | None = None, samples: int = 1) -> str:
    """Where a dataset stands as a run starts: `complete`, `skipped (budget met)`, `resuming
    from N of M` or `new`; with several samples per prompt, how its items count them."""
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
    if samples > 1:
        state += f" (items are samples: {samples} per prompt)"
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


def _eta_fields(eta: Eta | None) -> dict[str, str]:
    if eta is None:
        return {"eta_s": "-", "eta_p10_s": "-", "eta_p90_s": "-"}
    fields = {"eta_s": f"{eta.seconds:.0f}", "eta_p10_s": f"{eta.p10:.0f}"}
    fields["eta_p90_s"] = f"{eta.p90:.0f}"
    if eta.bound == "budget":
        fields["eta_bound"] = "budget"
    if eta.prior:
        fields["eta_basis"] = "prior"
    return fields


def progress_fields(stats: RunStats, now: float | None = None) -> list[tuple[str, str]]:
    """Where the run stands, as the `key=value` fields of its progress line, in their order
    (a dataset may be named like a field: both are kept): what run.log shows and what
    `regen status` reads back from state.db (`live_progress`)."""
    now = time.monotonic() if now is None else now
    elapsed = max(now - stats.started_at, 1e-9)
    t = _totals(stats)
    rates = stats.rolling(now)
    f = {"done": f"{t.done_before + t.done}/{t.items}", "failed": f"{t.failed}"}
    f |= {"in_flight": f"{t.in_flight}", "req_s": f"{t.done / elapsed:.2f}"}
    f |= {"req_s_1m": f"{rates[''][0]:.2f}", "out_tok_s": f"{t.completion_tokens / elapsed:.0f}"}
    f |= {"out_tok_s_1m": f"{rates[''][1]:.0f}", **_eta_fields(stats.etas(now)[1])}
    f |= {"completion_tokens": f"{t.completion_tokens}", "cost_usd": f"{t.cost_usd:.4f}"}
    f["usd_per_mtok"] = f"{per_mtok(t.cost_usd, t.completion_tokens):.2f}"
    f |= _money_fields(stats)
    if out := [name for name, e in stats.endpoints.items() if e.health.drained]:
        f["endpoints_out"] = f"{len(out)}/{len(stats.endpoints)}"
    if n := sum(budget_waits(stats).values()):
        f["budget_wait"] = f"{n}"
    if (down := pool_down_since(stats)) is not None:
        f["pool_down_since"] = f"{down:.0f}"
    f |= {"errors": errors_text(t.errors), "elapsed_s": f"{elapsed:.0f}"}
    pairs = list(f.items())
    pairs += [(name, f"{d.done_before + d.done}/{d.items}") for name, d in stats.datasets.items()]
    for name, lane in stats.lanes.items():
        pairs.append((f"lane_{name}", f"{lane.in_flight}/{lane.limit}/{lane.concurrency}"))
        if e := stats.lane_etas.get(name):
            pairs.append((f"eta_{name}_s", f"{e.seconds:.0f}"))
    return pairs


def _money_fields(stats: RunStats) -> dict[str, str]:
    """Credit, the cap's room and held bills, where there are any."""
    f = {}
    if stats.credits_usd is not None:
        f["credits_usd"] = f"{stats.credits_usd:.4f}"
    if (left := cap_left_usd(stats)) is not None:
        f["cost_left_usd"] = f"{left:.4f}"
    held = stats.holds()
    if held.requests and held.until is not None:
        f |= {"held": f"{held.requests}", "held_usd": f"{held.usd:.4f}"}
        f["held_until"] = f"{held.until:.0f}"
    return f


def progress_line(stats: RunStats, now: float | None = None) -> str:
    """One stable `key=value` line for logs and `tail -f` over SSH."""
    return line_of(log_stamp(), progress_fields(stats, now))


def line_of(stamp: str, fields: list[tuple[str, str]]) -> str:
    """A progress line: its time, then its fields."""
    return f"{stamp} progress " + " ".join(f"{k}={v}" for k, v in fields)


def budget_waits(stats: RunStats) -> Counter[str]:
    """Workers waiting for budget room, over the lanes, by what holds it."""
    out: Counter[str] = Counter()
    for lane in stats.lanes.values():
        out.update(lane.waiting)
    return out


def budget_wait_items(waits: Counter[str]) -> tuple[str, ...]:
    """`waiting for budget room: 12 on job dollar cap held by requests in flight`, then one
    item per other budget: work that is neither sent nor idle, and what it waits for."""
    why = [f"{n} on {what}" for what, n in waits.most_common()]
    return (f"waiting for budget room: {why[0]}", *why[1:]) if why else ()


def pool_down_since(stats: RunStats) -> float | None:
    """When the last server of the pool went out of it, while every one is out (None: some
    server is in); nothing is answered then, so no ETA stands."""
    eps = stats.endpoints.values()
    if not eps or not all(e.health.drained for e in eps):
        return None
    return max(e.outages[-1].start for e in eps if e.outages)


LIVE_COLUMNS: tuple[str, ...] = (
    "dataset",
    "done/total",
    "failed",
    "in flight",
    "req/s",
    "tok/s",
    "tokens/budget",
    "mean len",
    "$",
    "$/Mtok",
    "errors",
    "ETA (p10-p90)",
)
"""The live view's per-dataset columns on a wide terminal (rates are over the last minute)."""

DEGRADE_ORDER: tuple[str, ...] = (
    "$/Mtok",
    "mean len",
    "tokens/budget",
    "errors by class",
    "errors",
    "in flight",
    "tok/s",
    "req/s",
    "$",
    "failed",
)
"""What the per-dataset table gives up, first to last, until it fits the terminal's width:
`errors by class` turns each breakdown into its count, every other step drops its column.
The dataset, done/total and ETA columns always stay. Nothing the job as a whole needs is lost
on the way: the header above the table keeps done/total, rates, spend, what is left, the ETA
and errors by class, its items flowing onto another line rather than being cut (the errors
shorten to the commonest classes and `+N more`, then to the total, when one line cannot hold
them); a lane's line gives up its mean on the wire, then its answers, then flows likewise.
A dataset's name is the one value ever shortened (with an ellipsis, to no less than 8 cells),
and only when even the three columns that stay do not fit (below about 50 columns)."""


def fitting_table(
    console: Console,
    options: ConsoleOptions,
    build: Callable[[Sequence[str], int | None], Table],
    order: Sequence[str],
    rows: Sequence[dict[str, str]],
) -> Table:
    """The table `build` makes with the fewest of `order`'s steps given up that fits the
    console's width (the live view's and the end summary's rule)."""
    # Measured as if the console had room: a measure within its width would clamp to it.
    unbounded = options.update_width(1_000_000)
    excess = 0
    for steps in range(len(order) + 1):
        table = build(order[:steps], None)
        excess = Measurement.get(console, unbounded, table).maximum - options.max_width
        if excess <= 0:
            return table
    # Only the names give way (rich would otherwise cut every column a little).
    names = max(cell_len(c) for row in rows for c in (row["dataset"], "dataset"))
    return build(order, max(8, names - excess))


def _dataset_cells(
    name: str,
    d: DatasetStats,
    rate: tuple[float, float],
    eta: Eta | None,
    spent: int | None = None,
) -> dict[str, str]:
    """One dataset's row; `spent`: the tokens its budget counts over the whole job, which is
    what the budget is compared with (this run's alone would hide an earlier run's spend)."""
    used = format_tokens(d.completion_tokens if spent is None else spent)
    if d.token_budget is not None:
        used += f"/{format_tokens(d.token_budget)}"
    cells = (
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
    return dict(zip(LIVE_COLUMNS, cells, strict=True))


def _errors_item(errors: dict[str, int], width: int) -> str:
    """The job's errors by class, commonest first, in `width` cells: as many classes as fit,
    then `+N more`, at the least the total."""
    total = sum(errors.values())
    ranked = [f"{k} {v}" for k, v in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))]
    for shown in range(len(ranked), 0, -1):
        rest = len(ranked) - shown
        item = f"errors {total}: " + ", ".join(ranked[:shown]) + (f", +{rest} more" if rest else "")
        if cell_len(item) <= width:
            return item
    return f"errors {total}"


def _flow(items: Sequence[str], width: int, indent: str = "  ") -> list[str]:
    """Items joined by two spaces, onto as many lines as it takes: an item is never split
    (a later line starts with `indent`)."""
    lines: list[str] = []
    line = ""
    for item in items:
        if not line:
            line = item
        elif cell_len(line) + 2 + cell_len(item) <= width:
            line += "  " + item
        else:
            lines.append(line)
            line = indent + item
    return [*lines, line] if line else lines


@dataclass(frozen=True)
class ProgressView:
    """The live view at one moment, laid out for the width of the console that draws it.

    Its figures are taken in the event loop (`progress_view`), so that `Live`, which redraws
    from its own thread, reads nothing that the run is changing; the layout is chosen at each
    draw, so a resized terminal gets a fitting view at the next refresh. From the top: a header
    (elapsed, done/total, failed and in flight, req/s and tok/s over the last minute, the ETA
    with its p10-p90 interval, $ spent, $ left of the job's cap, the account's credit left,
    $/Mtok, and errors by class), the per-dataset table (its columns by width: see
    DEGRADE_ORDER), one line per lane (its adaptive limit over its concurrency, requests in
    flight, escalations, answers, mean on the wire), and why the run is stopping, once it is.
    """

    header: tuple[tuple[str, ...], ...]
    """Groups of items; each group starts a line."""
    errors: dict[str, int]
    rows: tuple[dict[str, str], ...]
    """Cells by column of each dataset, then of the total (bold) when there are several."""
    row_errors: tuple[dict[str, int], ...]
    lanes: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
    """Per lane, the items it always shows and those it gives up first when narrow."""
    stop_reason: str | None = None
    endpoints: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    """Per endpoint of a pool of several (or one that was out of it), as the lanes."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for group in self.header:
            for line in _flow(group, width):
                yield Text(line, no_wrap=True, overflow="ellipsis")
        yield Text(_errors_item(self.errors, width), no_wrap=True, overflow="ellipsis")
        if self.rows:
            yield self._fitting_table(console, options)
        for core, detail in (*self.lanes, *self.endpoints):
            items = [*core, *detail]
            while len(items) > len(core) and cell_len("  ".join(items)) > width:
                items.pop()
            for line in _flow(items, width, indent="    "):
                yield Text(line, style="dim", no_wrap=True, overflow="ellipsis")
        if self.stop_reason:
            yield Text(f"stopping: {self.stop_reason}", style="bold")

    def _fitting_table(self, console: Console, options: ConsoleOptions) -> Table:
        """The table with the most columns that fits, giving them up in DEGRADE_ORDER."""
        return fitting_table(console, options, self.table, DEGRADE_ORDER, self.rows)

    def table(self, given_up: Sequence[str] = (), name_width: int | None = None) -> Table:
        """The per-dataset table without the steps of DEGRADE_ORDER in `given_up`, its dataset
        names cut to `name_width` (with an ellipsis) if given."""
        table = Table(box=box.MINIMAL_HEAVY_HEAD, show_edge=False, expand=False)
        columns = [c for c in LIVE_COLUMNS if c not in given_up]
        for col in columns:
            if col == "dataset":
                table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=name_width)
            else:
                table.add_column(col, justify="left" if col == "errors" else "right", no_wrap=True)
        for i, (cells, errors) in enumerate(zip(self.rows, self.row_errors, strict=True)):
            total = len(self.rows) > 1 and i == len(self.rows) - 1
            if total:
                table.add_section()
            if "errors by class" in given_up:
                cells = {**cells, "errors": str(sum(errors.values()))}
            table.add_row(*(cells[c] for c in columns), style="bold" if total else None)
        return table


def _job_spent_usd(stats: RunStats) -> float:
    """Dollars the job has spent over all its runs (what its cap is measured against)."""
    return sum(
        d.cost_usd + (d.before.cost_usd if d.before is not None else 0.0)
        for d in stats.datasets.values()
    )


def cap_left_usd(stats: RunStats) -> float | None:
    """What the job's dollar cap still allows after the spend recorded so far (None: no cap)."""
    if stats.max_cost_usd is None:
        return None
    return max(0.0, stats.max_cost_usd - _job_spent_usd(stats))


def _eta_item(
    stats: RunStats,
    t: DatasetStats,
    held: HoldSummary,
    job_eta: Eta | None,
    elapsed: float,
    *,
    ended: bool,
) -> str:
    """The header's ETA: how long the run took once ended, or what it waits on, if anything."""
    if ended:
        return f"ended after {format_duration(elapsed)}"
    if (since := pool_down_since(stats)) is not None:
        # Nothing can be answered until a server is back: an ETA would be a guess.
        when = time.strftime("%H:%M:%S", time.localtime(since))
        return f"ETA: every server out of the pool since {when}, waiting for one to come back"
    if held.requests and not t.in_flight and held.until is not None and not stats.stop_reason:
        # Nothing goes out while held bills stand between the job and a budget: say so.
        return f"ETA: held for bills until {time.strftime('%H:%M:%S', time.localtime(held.until))}"
    return f"ETA {eta_text(job_eta)}"


def _money_items(stats: RunStats, t: DatasetStats) -> list[str]:
    """The header's money: spent (and the job's, when earlier runs spent too), what is left
    of the cap and of the credit, and the price per million completion tokens."""
    spent = f"spent ${t.cost_usd:,.4f}"
    job_spent = _job_spent_usd(stats)
    if job_spent > t.cost_usd:
        spent += f" (job ${job_spent:,.4f})"
    money = [spent]
    left = cap_left_usd(stats)
    if left is not None:
        money.append(f"left ${left:,.4f} of ${stats.max_cost_usd:,g} cap")
    if stats.credits_usd is not None:
        money.append(f"credit left ${stats.credits_usd:,.2f}")
    money.append(f"${per_mtok(t.cost_usd, t.completion_tokens):.2f}/Mtok")
    return money


def _dataset_rows(
    stats: RunStats,
    t: DatasetStats,
    rates: dict[str, tuple[float, float]],
    etas: dict[str, Eta | None],
    job_eta: Eta | None,
) -> tuple[list[dict[str, str]], list[dict[str, int]]]:
    """A row of cells per dataset, and the job's total when there are several; with each
    row, its errors by class."""
    rows = [
        _dataset_cells(
            name,
            d,
            rates[name],
            etas.get(name),
            stats.tokens_spent(name) if stats.tokens_spent and d.token_budget else None,
        )
        for name, d in stats.datasets.items()
    ]
    row_errors = [dict(d.errors) for d in stats.datasets.values()]
    if len(stats.datasets) > 1:
        rows.append(_dataset_cells("total", t, rates[""], job_eta))
        row_errors.append(dict(t.errors))
    return rows, row_errors


def _lane_items(stats: RunStats, now: float) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """A lane's core figures (limit, in flight, escalated) and the detail dropped first."""
    lanes: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for name, lane in stats.lanes.items():
        on_wire, _ = lane.wire.mean(now)
        core = [
            f"lane {name}",
            f"limit {lane.limit}/{lane.concurrency}",
            f"{lane.in_flight} in flight",
        ]
        if lane.escalated:
            core.append(f"{lane.escalated} escalated")
        detail = (f"{lane.done} done", f"mean {on_wire:.0f} on wire")
        lanes.append((tuple(core), detail))
    return lanes


def progress_view(
    stats: RunStats, now: float | None = None, *, ended: bool = False
) -> ProgressView:
    """The live view's figures now; it lays them out for the console's width when drawn. The
    last frame (`ended`) says when the run ended, not an ETA it no longer has."""
    now = time.monotonic() if now is None else now
    elapsed = max(now - stats.started_at, 1e-9)
    rates = stats.rolling(now)
    etas, job_eta = stats.etas(now)
    if ended:
        etas, job_eta = {}, None
    t = _totals(stats)
    held = stats.holds()
    progress = [
        f"regen {format_duration(elapsed)} elapsed",
        f"done {t.done_before + t.done}/{t.items}",
        f"failed {t.failed}",
        f"in flight {t.in_flight}",
        f"{rates[''][0]:.1f} req/s",
        f"{format_tokens(round(rates[''][1]))} tok/s",
        _eta_item(stats, t, held, job_eta, elapsed, ended=ended),
    ]
    money = _money_items(stats, t)
    rows, row_errors = _dataset_rows(stats, t, rates, etas, job_eta)
    lanes = _lane_items(stats, now)
    endpoints = []
    if len(stats.endpoints) > 1 or any(e.outages for e in stats.endpoints.values()):
        endpoints = [_endpoint_items(name, ep, now) for name, ep in stats.endpoints.items()]
    header: tuple[tuple[str, ...], ...] = (tuple(progress), tuple(money))
    if held.requests:
        header += ((held.line(),),)
    if waits := budget_waits(stats):
        header += (budget_wait_items(waits),)
    return ProgressView(
        header=header,
        errors=dict(t.errors),
        rows=tuple(rows),
        row_errors=tuple(row_errors),
        lanes=tuple(lanes),
        stop_reason=stats.stop_reason,
        endpoints=tuple(endpoints),
    )


def _endpoint_items(
    name: str, ep: EndpointStats, now: float
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An endpoint's line: what it always shows (its state, requests on the wire, its limit)
    and what it gives up first when narrow."""
    if ep.health.drained:
        since = time.strftime("%H:%M:%S", time.localtime(ep.outages[-1].start))
        state = f"OUT of the pool since {since}"
    elif not ep.health.healthy:
        state = f"cooling down {max(0.0, ep.health.cool_until - now):.0f}s"
    else:
        state = "up"
    core = (f"endpoint {name}", state, f"{ep.on_wire} on wire", f"limit {ep.limit}")
    detail = [f"{ep.answers} answered", f"{ep.failed} failed"]
    if ep.answers:
        detail.append(f"mean {ep.latency_sum_s / ep.answers:.1f}s")
    if ep.outages:
        n = len(ep.outages)
        detail.append(f"{n} outage{'s' if n != 1 else ''}, {ep.resent} re-sent")
    return core, tuple(detail)


class ProgressReporter:
    """Shows progress until cancelled: live on a TTY (a ProgressView, taken four times a second
    and drawn at the terminal's width of the moment), a line every `interval_s` otherwise.

    Every line also goes to `log_path` (run.log), whatever stdout is; without a console
    (a run nobody watches), only there.
    """

    def __init__(
        self,
        stats: RunStats,
        console: Console | None,
        interval_s: float,
        log_path: Path | None,
        publish: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self._stats = stats
        self._console = console
        self._interval_s = interval_s
        self._log_path = log_path
        self._log_file: RunLog | None = None
        self._publish = publish
        """Where each line's fields also go, as data (state.db, for `regen status`)."""

    def _line(self, now: float | None = None) -> str:
        """The progress line of now, logged, and its fields published with its time."""
        stamp, fields = log_stamp(), progress_fields(self._stats, now)
        line = line_of(stamp, fields)
        self._log(line)
        if self._publish is not None:
            self._publish({"at": stamp, **dict(fields)})
        return line

    def _log(self, line: str) -> None:
        if self._log_file is None:
            return
        try:
            self._log_file.write(line)
        except StateError as exc:
            # A full disk must not end the run over its log: say so once, keep showing progress.
            self._close_log()
            self._say(f"warning: cannot write progress lines: {exc}")

    def _say(self, line: str) -> None:
        if self._console is not None:
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _say_gate(self) -> None:
        """What the gate refused since the last tick: each source and field once."""
        for line in self._stats.gate.take_lines():
            self._log(line)
            self._say(line)

    def _close_log(self) -> None:
        log, self._log_file = self._log_file, None
        if log is not None:
            log.close()

    async def run(self) -> None:
        if self._log_path is not None:
            try:
                self._log_file = RunLog(self._log_path)
            except StateError as exc:
                self._say(f"warning: {exc}")
        live: Live | None = None
        try:
            if self._console is not None and self._console.is_terminal:
                live = Live(
                    progress_view(self._stats),
                    console=self._console,
                    refresh_per_second=4,
                    transient=False,
                )
                live.start()
            last_line = 0.0
            while True:
                now = time.monotonic()
                self._say_gate()
                if live is not None:
                    live.update(progress_view(self._stats, now))
                if now - last_line >= self._interval_s:
                    line = self._line(now)
                    if live is None:
                        self._say(line)
                    last_line = now
                await asyncio.sleep(0.25 if live is not None else min(self._interval_s, 1.0))
        finally:
            self._say_gate()
            final = self._line()
            if live is not None:
                live.update(progress_view(self._stats, ended=True))
                live.stop()
            else:
                self._say(final)
            self._close_log()


class Watch:
    """How a run's progress is shown, handed down to run/ by the command: live or as lines on
    its console, or nowhere without one (run.log gets the lines either way)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console

    def reporter(
        self,
        stats: RunStats,
        interval_s: float,
        log_path: Path | None,
        publish: Callable[[dict[str, str]], None] | None = None,
    ) -> ProgressReporter:
        """The progress reporter of one dispatch."""
        return ProgressReporter(stats, self.console, interval_s, log_path, publish)


Shown = Watch | None
"""What a caller hands run/ for progress: a Watch, or nothing (shown nowhere)."""


SUMMARY_COLUMNS = (
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
SUMMARY_DEGRADE_ORDER = (
    "errors by class",
    "$/Mtok",
    "prompt tok",
    "dupes",
    "bad",
    "rows",
    "errors",
    "completion tok",
)
"""What the end-of-run table gives up, first to last, until it fits the console's width (as
the live view's DEGRADE_ORDER): `errors by class` turns each breakdown into its count, every
other step drops its column. The dataset, items, done, failed, cost and exported columns
always stay (what the run did and what it cost), in 80 columns with names of up to 20; only
then are dataset names shortened."""


class SummaryView:
    """The end-of-run table: per dataset, what is done and what it cost (from state.db), laid
    out for the width of the console that draws it."""

    def __init__(
        self,
        datasets: list[DatasetProgress],
        errors: dict[tuple[str, str], int],
        exports: dict[str, int],
    ) -> None:
        self.rows: list[dict[str, str]] = []
        self.row_errors: list[dict[str, int]] = []
        for d in datasets:
            errs = {c: n for (ds, c), n in errors.items() if ds == d.name}
            cells = (
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
                f"{per_mtok(d.cost_usd, d.completion_tokens):.2f}",
                errors_text(errs),
                str(exports.get(d.name, 0)),
            )
            self.rows.append(dict(zip(SUMMARY_COLUMNS, cells, strict=True)))
            self.row_errors.append(errs)

    def table(self, given_up: Sequence[str] = (), name_width: int | None = None) -> Table:
        table = Table(title="summary", title_justify="left")
        columns = [c for c in SUMMARY_COLUMNS if c not in given_up]
        for col in columns:
            if col == "dataset":
                table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=name_width)
            else:
                table.add_column(col, justify="left" if col == "errors" else "right", no_wrap=True)
        for cells, errs in zip(self.rows, self.row_errors, strict=True):
            if "errors by class" in given_up:
                cells = {**cells, "errors": str(sum(errs.values()))}
            table.add_row(*(cells[c] for c in columns))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fitting_table(console, options, self.table, SUMMARY_DEGRADE_ORDER, self.rows)


def summary_table(
    datasets: list[DatasetProgress], errors: dict[tuple[str, str], int], exports: dict[str, int]
) -> SummaryView:
    """The end-of-run table (SummaryView), fitted to the console's width when printed."""
    return SummaryView(datasets, errors, exports)


def outages_line(
    endpoint: str, outages: Sequence[OutageRecord], *, now: float, still_out: str = "out since"
) -> str:
    """An endpoint's outages in one line: how many, how long in all (one not over counts
    until `now`), the longest, and the requests that went to the other servers; one not over
    is named with `still_out` and when it began."""
    spans = [(o.ended_at if o.ended_at is not None else now) - o.started_at for o in outages]
    resent = sum(o.resent for o in outages)
    n = len(outages)
    line = (
        f"endpoint {endpoint}: out of the pool {n} time{'s' if n != 1 else ''} (server down or "
        f"loading; probed until back), {format_duration(sum(spans))} in all"
    )
    if n > 1:
        line += f", longest {format_duration(max(spans))}"
    # With one server they waited for it: "to the other servers" would be untrue.
    line += f"; {resent} request{'s' if resent != 1 else ''} re-sent (to another server, or "
    line += "to it once back)"
    if outages[-1].ended_at is None:
        line += f"; {still_out} {time.strftime('%H:%M:%S', time.localtime(outages[-1].started_at))}"
    return line


def endpoints_table(totals: Sequence[EndpointTotals]) -> Table:
    """Per endpoint of a pool, what it answered and failed for the job (all runs)."""
    table = Table(title="endpoints", title_justify="left", box=box.MINIMAL_HEAVY_HEAD)
    for col in ("endpoint", "answers", "failed", "completion tok", "$"):
        table.add_column(col, justify="left" if col == "endpoint" else "right", no_wrap=True)
    for t in totals:
        table.add_row(
            t.endpoint,
            str(t.answers),
            str(t.failed),
            format_tokens(t.completion_tokens),
            f"{t.cost_usd:.4f}",
        )
    return table


def bad_rows_table(
    groups: list[BadRowGroup], title: str = "rows not used (row numbers count from 0)"
) -> Table:
    """Why rows were not used (or, with its title, notes on rows used), commonest first: each
    reason as its first row had it, and the rows to look at (counted from 0 in the source)."""
    table = Table(title=title, title_justify="left")
    for col in ("rows", "dataset", "source", "first rows", "reason (of the first)"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for g in groups:
        first = ", ".join(map(str, g.first_rows)) + (", ..." if g.rows > len(g.first_rows) else "")
        table.add_row(str(g.rows), g.dataset, g.source, first, g.example)
    return table
