"""The page: the stylesheet, the overview table, the job, endpoint and dataset sections in
order, and writing report.html atomically."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from pathlib import Path

from regen import __version__
from regen.errors import StateError
from regen.lock import running_holder
from regen.outputs.report.axes import RATE_STEP_S, TimeAxis, activity_spans
from regen.outputs.report.data import Report, gather
from regen.outputs.report.dataset import DS_WIDTH, dataset_section
from regen.outputs.report.endpoints import endpoint_section
from regen.outputs.report.job import job_section
from regen.outputs.report.markup import html_table
from regen.outputs.report.svg import Plot
from regen.safe import confined, root_for, write_text_atomic
from regen.state.db import Store

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1240px}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:right}th{background:#f3f3f3}.dim{color:#888}.note{background:#fff6d6;padding:.4em .8em}
svg.chart{max-width:100%;height:auto;display:block}svg text{fill:#444;font-size:11px}
svg .grid{stroke:#e4e4e4}svg .axis{stroke:#888}svg .title{fill:#222;font-size:12px}
svg .bar{fill:#2a7}svg .gap rect{fill:#f2f2f2}svg .gap path{stroke:#666;fill:none}
svg .run-start{stroke:#333;stroke-dasharray:3 2}svg .run-label{font-weight:600;fill:#222}
svg .cap{stroke:#c22;stroke-dasharray:6 3;stroke-width:1.5}svg .cap-label{fill:#c22}
svg .max-tokens{stroke:#c22;stroke-dasharray:4 2;stroke-width:1.5}svg .max-label{fill:#c22}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em}
h3{font-size:13px;margin:.8em 0 .2em}section{border-top:2px solid #ddd;margin-top:1.5em}
.legend span{margin-right:1.2em;font-size:12px;white-space:nowrap}
.legend i{display:inline-block;width:22px;margin-right:4px;vertical-align:middle}
"""


def render(out_dir: Path, report: Report) -> str:
    reports = report.datasets
    total_cost = sum(r.progress.cost_usd for r in reports)
    total_tokens = sum(r.progress.completion_tokens for r in reports)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    overview = html_table(
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
    spans = activity_spans(report.job)
    plot = Plot(DS_WIDTH, 1)
    axis = TimeAxis.build(spans, plot.pw, RATE_STEP_S) if spans else None
    body = "".join(dataset_section(r, axis, report.job) for r in reports)
    endpoints = endpoint_section(report.endpoints, report.job, spans)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>regen report: {html.escape(out_dir.name)}</title><style>{STYLE}</style></head>
<body><h1>regen report</h1>
<p>{html.escape(str(out_dir))} &middot; written {when} by regen {__version__} &middot;
${total_cost:,.4f} spent on {total_tokens:,} completion tokens</p>
{overview}{job_section(report)}{endpoints}{body}
</body></html>
"""


def write_report(out_dir: Path, to: Path | None = None) -> Path:
    """Write the report (atomically, keys taken out) and return its path. A path that is, or
    passes through, a link out of its folder is refused before state.db is read."""
    path = to or out_dir / "report.html"
    root = root_for(path, out_dir)
    confined(root, path)
    store = Store.open_readonly(out_dir)
    try:
        page = render(out_dir, gather(store, live=running_holder(out_dir) is not None))
    finally:
        store.close()
    try:
        write_text_atomic(root, path, page)
    except OSError as exc:
        raise StateError(f"{path}: cannot write the report: {exc}") from exc
    return path
