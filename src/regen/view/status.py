"""`regen status`: where a job stands, read from its output directory by another process.

Everything comes from state.db opened read-only (safe while a run writes it), including the
progress fields the running process last wrote there (rates and requests in flight, which only
it knows), and from run.lock (whether a run holds the directory, and its pid).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from regen.engine.budget import per_mtok
from regen.engine.eta import Eta, eta_text, format_duration
from regen.lock import running_holder
from regen.safe import printable
from regen.state.db import Store
from regen.state.runs import OutageRecord, RunRecord
from regen.state.sources import BadRowGroup
from regen.state.spend import EndpointTotals, FailedAttempt
from regen.state.work import DatasetProgress
from regen.view.progress import bad_rows_table, errors_text, format_tokens, outages_line


@dataclass(frozen=True)
class Snapshot:
    """A job's state at one moment."""

    out_dir: str
    running_pid: int | None
    datasets: list[DatasetProgress]
    errors: dict[tuple[str, str], int]
    recent_failures: list[FailedAttempt]
    top_failure_reasons: list[tuple[str, str, int]]
    bad_row_reasons: list[BadRowGroup]
    progress: dict[str, str]
    """The fields of the last progress line, as the run wrote them to state.db (empty before
    the first)."""
    live_audit: dict[str, Any] | None = None
    """The live audit's tally (`[reconstruct] live_audit`), as the run last wrote it."""
    held: tuple[int, float, float | None] = (0, 0.0, None)
    """Requests of earlier runs (killed, or ended before their bills came) whose bills are not
    known yet: how many, up to how many dollars, and the latest time they are held until."""
    row_notes: list[BadRowGroup] = field(default_factory=list)
    """What the reads noticed in rows they used, commonest first."""
    endpoints: list[EndpointTotals] = field(default_factory=list)
    """Per endpoint of the pool, what it answered and failed (all runs)."""
    outages: list[OutageRecord] = field(default_factory=list)
    """Each time a run took an endpoint out of its pool, oldest first."""
    live_run: int | None = None
    """The id of the run holding the directory now (None: not running)."""
    run_ends: dict[int, float | None] = field(default_factory=dict)
    """When each run ended (a killed one: its last timeline point)."""
    runs: list[RunRecord] = field(default_factory=list)
    """Every run and pilot, oldest first: how and why each ended."""


def take_snapshot(out_dir: Path) -> Snapshot:
    store = Store.open_readonly(out_dir)
    try:
        pid = running_holder(out_dir)
        runs = store.runs.all() if store.records("runs") else []
        live = None
        if pid is not None:
            live = max((r.id for r in runs), default=None)
        return Snapshot(
            str(out_dir),
            pid,
            store.work.dataset_progress(),
            store.spend.failure_counts(),
            store.spend.recent_failures(),
            store.spend.top_failure_reasons(),
            store.sources.bad_row_reasons(),
            _progress(store.get_meta("live_progress")),
            _live_audit(store.get_meta("live_audit")),
            store.outstanding.held(live) if store.records("held") else (0, 0.0, None),
            store.sources.bad_row_reasons(table="row_notes") if store.records("row_notes") else [],
            store.spend.by_endpoint() if store.records("outages") else [],
            store.runs.outages() if store.records("outages") else [],
            live,
            {r.id: r.ended_at for r in runs},
            runs,
        )
    finally:
        store.close()


def _live_audit(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _progress(raw: str | None) -> dict[str, str]:
    """The running (or last) run's progress fields, as it last wrote them to state.db (empty
    before its first progress line, or from a regen that did not write them)."""
    try:
        data = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def snapshot_json(s: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON data (`regen status --json`)."""
    return {
        "out_dir": s.out_dir,
        "running": s.running_pid is not None,
        "pid": s.running_pid,
        "datasets": [
            {
                **asdict(d),
                "pending": d.pending,
                "usd_per_mtok": per_mtok(d.cost_usd, d.completion_tokens),
                "errors": {c: n for (ds, c), n in s.errors.items() if ds == d.name},
            }
            for d in s.datasets
        ],
        "recent_failures": [asdict(f) for f in s.recent_failures],
        "top_failure_reasons": [
            {"class": c, "message": m, "count": n} for c, m, n in s.top_failure_reasons
        ],
        "bad_row_reasons": [asdict(g) for g in s.bad_row_reasons],
        "row_notes": [asdict(g) for g in s.row_notes],
        "progress": {k: _typed(v) for k, v in s.progress.items()},
        "runs": [
            {
                "id": r.id,
                "kind": r.kind,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "end_kind": "running" if r.id == s.live_run else _end_kind(r),
                "stop_reason": r.stop_reason,
                "exit_code": r.exit_code,
                "ended": r.ending(live=r.id == s.live_run),
            }
            for r in s.runs
        ],
        "live_audit": s.live_audit,
        "held": {"requests": s.held[0], "usd": s.held[1], "until": s.held[2]},
        "endpoints": [asdict(e) for e in s.endpoints],
        "outages": [asdict(o) for o in s.outages],
    }


def _typed(value: str) -> int | float | str | None:
    """A run.log progress value as JSON wants it: a number as a number, "-" as null."""
    if value == "-":
        return None
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        return number if number == number and abs(number) != float("inf") else value
    return value


def _end_kind(r: RunRecord) -> str:
    """A run's end kind: `killed` when it never recorded its end."""
    if r.killed:
        return "killed"
    return r.end_kind or ("finished" if r.stop_reason is None else "stopped")


def run_lines(s: Snapshot) -> list[Text]:
    """A line per run and pilot: when it started, how long it lasted, how and why it ended."""
    lines = []
    number = 0
    for r in s.runs:
        if r.kind == "run":
            number += 1
        label = "pilot" if r.kind == "pilot" else f"run {number}"
        start = datetime.fromtimestamp(r.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        took = "" if r.ended_at is None else f", {format_duration(r.ended_at - r.started_at)}"
        live = r.id == s.live_run
        ending = r.ending(live=live)
        style = "red" if r.killed and not live else ""
        # The stop reason may quote a server's words: escaped, as every line regen prints.
        line = printable(f"{label}: started {start} UTC{took}; {ending}")
        lines.append(Text(line, style=style))
    return lines


def _endpoint_lines(s: Snapshot) -> list[Text]:
    """A line per endpoint of a pool of several, or of any that was ever out of its pool:
    what it answered and failed, and its outages (red while one is not over)."""
    outages: dict[str, list[OutageRecord]] = {}
    for o in s.outages:
        # One that its run never saw end (the run was killed, or ended first) is over by the
        # run's last word: only the running run's may still go on.
        if o.ended_at is None and o.run_id != s.live_run:
            o = replace(o, ended_at=s.run_ends.get(o.run_id) or o.started_at)
        outages.setdefault(o.endpoint, []).append(o)
    names = [e.endpoint for e in s.endpoints]
    if len(names) < 2 and not outages:
        return []
    totals = {e.endpoint: e for e in s.endpoints}
    now = datetime.now().timestamp()
    lines = []
    for name in [*names, *sorted(set(outages) - set(names))]:
        t = totals.get(name) or EndpointTotals(name)
        line = (
            f"endpoint {name}: {t.answers} answers, {t.failed} failed attempts, "
            f"{format_tokens(t.completion_tokens)} completion tokens, ${t.cost_usd:.4f}"
        )
        out = outages.get(name, [])
        if out:
            line += "; " + outages_line(name, out, now=now).split(": ", 1)[1]
        lines.append(Text(line, style="red" if out and out[-1].ended_at is None else ""))
    return lines


def _progress_clause(s: Snapshot) -> str:
    """What run.log's last progress line said: rates, credit, and what the run waited on."""
    p = s.progress
    clause = (
        f"; last progress {p.get('at', '?')}: in flight {p.get('in_flight', '?')}, "
        f"{p.get('req_s', '?')} req/s, {p.get('out_tok_s', '?')} output tok/s"
    )
    if "credits_usd" in p:
        clause += f", credit ${float(p['credits_usd']):,.2f}"
    held_until = p.get("held_until")
    down = p.get("pool_down_since")
    if s.running_pid is not None and down:
        when = datetime.fromtimestamp(float(down)).strftime("%H:%M:%S")
        clause += f", every server out of the pool since {when} as of that line"
    elif s.running_pid is not None and held_until and p.get("in_flight") == "0":
        when = datetime.fromtimestamp(float(held_until)).strftime("%H:%M:%S")
        clause += f", waiting for held bills (until {when} at the latest) as of that line"
    elif p.get("eta_s", "-") != "-" and s.running_pid is not None:
        eta = Eta(
            float(p["eta_s"]),
            float(p["eta_p10_s"]),
            float(p["eta_p90_s"]),
            p.get("eta_bound", "count"),
            prior=p.get("eta_basis") == "prior",
        )
        clause += f", ETA {eta_text(eta)} as of that line"
    if s.running_pid is not None and p.get("budget_wait"):
        # Neither sent nor idle: a budget's room is held by requests not settled yet.
        clause += f"; {p['budget_wait']} items waiting for budget room"
    return clause


def _head_line(s: Snapshot) -> str:
    """The first line: whether a run holds the directory, then its last progress if any."""
    head = (
        f"{s.out_dir}: running (pid {s.running_pid})"
        if s.running_pid is not None
        else f"{s.out_dir}: not running"
    )
    if s.progress:
        head += _progress_clause(s)
    return head


def _datasets_table(s: Snapshot) -> Table:
    """A row per dataset; the cached and orphans columns only when some dataset has them."""
    table = Table(title="datasets", title_justify="left")
    cols = (
        "dataset",
        "rows",
        "bad",
        "done/total",
        "failed",
        "pending",
        "prompt tok",
        "completion tok",
    )
    # Answers to rows gone from a source: a column only when there are some.
    orphans = ("orphans",) if _has_orphans(s) else ()
    # Prompt tokens read from providers' caches (billed at their cache price): when some were.
    cached = ("cached tok",) if any(d.cached_tokens for d in s.datasets) else ()
    for col in (*cols[:-1], *cached, cols[-1], *orphans, "cost $", "$/Mtok", "errors"):
        table.add_column(col, justify="left" if col in ("dataset", "errors") else "right")
    for d in s.datasets:
        errs = {c: n for (ds, c), n in s.errors.items() if ds == d.name}
        table.add_row(
            d.name,
            str(d.rows_read),
            str(d.bad_rows),
            f"{d.done}/{d.items}",
            str(d.failed),
            str(d.pending),
            format_tokens(d.prompt_tokens),
            *((format_tokens(d.cached_tokens),) if cached else ()),
            format_tokens(d.completion_tokens),
            *((str(d.orphans),) if orphans else ()),
            f"{d.cost_usd:.4f}",
            f"{per_mtok(d.cost_usd, d.completion_tokens):.2f}",
            errors_text(errs),
        )
    return table


def _has_orphans(s: Snapshot) -> bool:
    """Whether some dataset kept answers to rows no longer in its source."""
    return any(d.orphans for d in s.datasets)


def _held_line(s: Snapshot) -> Text | None:
    """Requests of earlier runs whose bills may still come, and until when they are held."""
    n, usd, until = s.held
    if not n:
        return None
    when = datetime.fromtimestamp(until).strftime("%H:%M:%S") if until else "-"
    who = "earlier runs" if s.running_pid is not None else "runs that ended"
    return Text(
        f"held: {n} requests of {who} may still be billed "
        f"({f'up to ${usd:.4f}' if usd > 0 else 'unpriced'}); "
        f"{'this' if s.running_pid is not None else 'the next'} run holds them against "
        f"the budgets until their bills are known (until {when} at the latest)"
    )


def _audit_lines(s: Snapshot) -> list[Text]:
    """The live audit's tally (red while some answer fails it), then its recent drifts."""
    a = s.live_audit
    if not a:
        return []
    line = (
        f"live audit ({a.get('family')}): {a.get('checked', 0)} answers checked, "
        f"{a.get('failed', 0)} failing, mean |diff| {a.get('mean_abs_diff', 0):.2f} "
        f"completion / {a.get('prompt_mean_abs_diff', 0):.2f} prompt tokens"
    )
    lines = [Text(line, style="red" if a.get("failed") else "")]
    for d in a.get("recent_drifts") or []:
        lines.append(
            Text(
                f"  {d.get('dataset')} item {d.get('item_id')}: rebuilt {d.get('rebuilt')}, "
                f"billed {d.get('billed')} ({', '.join(d.get('problems') or [])})"
            )
        )
    return lines


def _failure_tables(s: Snapshot) -> list[Table]:
    """The last failed attempts and the commonest failure reasons, each when there are some."""
    tables = []
    if s.recent_failures:
        recent = Table(title="last failed attempts", title_justify="left")
        for col in ("when (UTC)", "dataset", "item", "class", "status", "message"):
            recent.add_column(col)
        for f in s.recent_failures:
            when = datetime.fromtimestamp(f.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
            recent.add_row(
                when,
                f.dataset,
                f.item_id[:12],
                f.failure_class,
                "" if f.status is None else str(f.status),
                (f.message or "")[:100],
            )
        tables.append(recent)
    if s.top_failure_reasons:
        top = Table(title="top failure reasons", title_justify="left")
        for col in ("attempts", "class", "message"):
            top.add_column(col, justify="right" if col == "attempts" else "left")
        for c, m, n in s.top_failure_reasons:
            top.add_row(str(n), c, m[:120])
        tables.append(top)
    return tables


_ORPHANS_NOTE = (
    "orphans: answers to rows no longer in their dataset's source (as last read in "
    "full): kept in state.db and in the cost, left out of exports unless `regen "
    "export --keep-orphans` and of the other counts"
)


def snapshot_view(s: Snapshot) -> Group:
    """The snapshot for a terminal: who runs it, per-dataset table, recent and top failures."""
    parts: list[Any] = [Text(_head_line(s)), _datasets_table(s), *run_lines(s)]
    parts += _endpoint_lines(s)
    if _has_orphans(s):
        parts.append(Text(_ORPHANS_NOTE))
    held = _held_line(s)
    if held is not None:
        parts.append(held)
    parts += _audit_lines(s)
    parts += _failure_tables(s)
    if s.bad_row_reasons:
        parts.append(bad_rows_table(s.bad_row_reasons))
    if s.row_notes:
        parts.append(bad_rows_table(s.row_notes, "notes on rows used (row numbers count from 0)"))
    return Group(*parts)
