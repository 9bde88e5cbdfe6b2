"""`<out>/report.html`: what a job did, per dataset, as one self-contained page.

Throughput over time, the completion-length histogram, latency percentiles, cost, errors by
class and the providers that served the answers, all read from state.db (read-only). Charts
are inline SVG: the page needs no script and no network, so it opens anywhere, offline.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from regen import __version__
from regen.errors import StateError
from regen.export import write_text_atomic
from regen.progress import per_mtok
from regen.store import DatasetProgress, Store

BINS = 30


@dataclass
class DatasetReport:
    progress: DatasetProgress
    finished_at: list[float] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    providers: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)


def gather(store: Store) -> list[DatasetReport]:
    reports = {p.name: DatasetReport(p) for p in store.dataset_progress()}
    for ds, created, tokens, latency, provider, finish in store.result_facts():
        r = reports.get(ds)
        if r is None:
            continue
        r.finished_at.append(created)
        r.completion_tokens.append(tokens)
        r.latencies.append(latency)
        key = provider or "(not said)"
        r.providers[key] = r.providers.get(key, 0) + 1
        reason = finish or "(none)"
        r.finish_reasons[reason] = r.finish_reasons.get(reason, 0) + 1
    for (ds, cls), n in store.failure_counts().items():
        if ds in reports:
            reports[ds].errors[cls] = n
    return list(reports.values())


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _svg_bars(values: list[float], labels: tuple[str, str], width: int = 560) -> str:
    """A histogram of `values` in BINS bins, with the axis ends labelled."""
    if not values:
        return "<p class=dim>no answers</p>"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    counts = [0] * BINS
    for v in values:
        counts[min(BINS - 1, int((v - lo) / span * BINS))] += 1
    top = max(counts)
    height, bar = 140, width / BINS
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - c / top * height:.1f}" width="{bar - 1:.1f}" '
        f'height="{c / top * height:.1f}"><title>{c}</title></rect>'
        for i, c in enumerate(counts)
    )
    return (
        f'<svg viewBox="0 0 {width} {height + 18}" width="{width}" height="{height + 18}" '
        f'role="img">{rects}<text x="0" y="{height + 14}">{html.escape(labels[0])}</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">{html.escape(labels[1])}</text>'
        "</svg>"
    )


def _svg_line(points: list[tuple[float, float]], caption: str, width: int = 560) -> str:
    if len(points) < 2:
        return "<p class=dim>not enough answers for a curve</p>"
    height = 140
    xmax = points[-1][0] or 1.0
    ymax = max(y for _, y in points) or 1.0
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{x / xmax * width:.1f},{height - y / ymax * height:.1f}"
        for i, (x, y) in enumerate(points)
    )
    return (
        f'<svg viewBox="0 0 {width} {height + 18}" width="{width}" height="{height + 18}" '
        f'role="img"><path d="{path}" fill="none" stroke="currentColor" stroke-width="1.5"/>'
        f'<text x="0" y="{height + 14}">0</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">{html.escape(caption)}</text>'
        f'<text x="2" y="12">{ymax:,.1f}/min</text></svg>'
    )


def _throughput(finished_at: list[float]) -> tuple[list[tuple[float, float]], str]:
    """Answers per minute over time, in up to 60 steps."""
    if len(finished_at) < 2:
        return [], ""
    times = sorted(finished_at)
    start, end = times[0], times[-1]
    span = max(end - start, 1e-9)
    # Answers are committed in groups a fraction of a second apart: no bin narrower than 1 s.
    steps = max(1, min(60, int(span)))
    width = span / steps
    counts = [0] * steps
    for t in times:
        counts[min(steps - 1, int((t - start) / width))] += 1
    per_min = 60.0 / width
    points = [((i + 0.5) * width, c * per_min) for i, c in enumerate(counts)]
    minutes = span / 60
    return points, (f"{minutes:.1f} min" if minutes >= 1 else f"{span:.0f} s")


def _table(rows: Sequence[tuple[str, ...]], head: tuple[str, ...]) -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{cells}</tbody></table>"


def _counts(d: dict[str, int]) -> str:
    if not d:
        return "<p class=dim>none</p>"
    total = sum(d.values())
    rows = [(k, f"{n:,}", f"{n / total:.1%}") for k, n in sorted(d.items(), key=lambda kv: -kv[1])]
    return _table(rows, ("", "count", "share"))


def _section(r: DatasetReport) -> str:
    p = r.progress
    lat = sorted(r.latencies)
    points, span = _throughput(r.finished_at)
    summary = _table(
        [
            (
                f"{p.items:,}",
                f"{p.done:,}",
                f"{p.failed:,}",
                f"{p.pending:,}",
                f"{p.bad_rows:,}",
                f"{p.prompt_tokens:,}",
                f"{p.completion_tokens:,}",
                f"${p.cost_usd:,.4f}",
                f"${per_mtok(p.cost_usd, p.completion_tokens):,.2f}",
            )
        ],
        (
            "items",
            "done",
            "failed",
            "pending",
            "bad rows",
            "prompt tok",
            "completion tok",
            "cost",
            "$/Mtok",
        ),
    )
    latency = _table(
        [tuple(f"{percentile(lat, q):.2f} s" for q in (0.5, 0.9, 0.99)) + (f"{lat[-1]:.2f} s",)]
        if lat
        else [("-", "-", "-", "-")],
        ("p50", "p90", "p99", "max"),
    )
    lengths = [float(t) for t in r.completion_tokens]
    hist = _svg_bars(
        lengths, (f"{min(lengths, default=0):,.0f}", f"{max(lengths, default=0):,.0f} tokens")
    )
    return f"""
<section>
<h2>{html.escape(p.name)}</h2>
{summary}
<div class=grid>
<div><h3>throughput (answers per minute)</h3>{_svg_line(points, span)}</div>
<div><h3>completion length (tokens)</h3>{hist}</div>
<div><h3>latency of answers</h3>{latency}<h3>finish reasons</h3>{_counts(r.finish_reasons)}</div>
<div><h3>providers that served</h3>{_counts(r.providers)}
<h3>failed attempts by class</h3>{_counts(r.errors)}</div>
</div>
</section>"""


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1240px}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:right}th{background:#f3f3f3}.dim{color:#888}svg{color:#2a6;fill:#2a6}
svg text{fill:#555;font-size:11px}.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));
gap:1em}h3{font-size:13px;margin:.8em 0 .2em}section{border-top:2px solid #ddd;margin-top:1.5em}
"""


def render(out_dir: Path, reports: list[DatasetReport]) -> str:
    total_cost = sum(r.progress.cost_usd for r in reports)
    total_tokens = sum(r.progress.completion_tokens for r in reports)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    overview = _table(
        [
            (
                r.progress.name,
                f"{r.progress.done:,}/{r.progress.items:,}",
                f"{r.progress.failed:,}",
                f"{r.progress.completion_tokens:,}",
                f"${r.progress.cost_usd:,.4f}",
            )
            for r in reports
        ],
        ("dataset", "done/items", "failed", "completion tok", "cost"),
    )
    body = "".join(_section(r) for r in reports)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>regen report: {html.escape(out_dir.name)}</title><style>{STYLE}</style></head>
<body><h1>regen report</h1>
<p>{html.escape(str(out_dir))} &middot; written {when} by regen {__version__} &middot;
${total_cost:,.4f} spent on {total_tokens:,} completion tokens</p>
{overview}{body}
</body></html>
"""


def write_report(out_dir: Path, to: Path | None = None) -> Path:
    """Write the report (atomically) and return its path."""
    store = Store.open_readonly(out_dir)
    try:
        page = render(out_dir, gather(store))
    finally:
        store.close()
    path = to or out_dir / "report.html"
    try:
        write_text_atomic(path, page)
    except OSError as exc:
        raise StateError(f"{path}: cannot write the report: {exc}") from exc
    return path
