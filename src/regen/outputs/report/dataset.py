"""One section per dataset: its totals, the tokens of its answers (reasoning and content
apart), throughput, the completion-length histogram marked at each lane's max_tokens,
latency percentiles, finish reasons, lanes, providers and failed attempts by class.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from regen.engine.budget import per_mtok
from regen.measures import quantile
from regen.outputs.report.axes import TimeAxis, fmt_tick, nice_step, nice_ticks
from regen.outputs.report.data import DatasetReport, JobFacts, run_labels
from regen.outputs.report.markup import html_esc, html_table
from regen.outputs.report.svg import PALETTE, Plot, chart_frame, coord, rate_series, time_chart
from regen.state.runs import RunRecord

DS_WIDTH = 580


def _histogram(values: Sequence[int], markers: list[tuple[str, int]]) -> str:
    """Completion lengths in 1-2-5-wide bins from 0, with a labelled line at each lane's
    max_tokens: a pile-up against one means answers cut short."""
    if not values:
        return "<p class=dim>no answers</p>"
    hi = float(max(max(values), max((m for _, m in markers), default=0)))
    bw = max(1.0, nice_step(hi, 40))
    counts = [0] * (int(hi // bw) + 1)
    for v in values:
        counts[int(v // bw)] += 1
    xticks_v = nice_ticks(len(counts) * bw, 6)
    xmax = xticks_v[-1]
    yticks = nice_ticks(max(counts) * 1.04, whole=True)
    plot = Plot(DS_WIDTH, 220, ymax=yticks[-1])
    sx = plot.pw / xmax
    base = plot.top + plot.ph
    body = [
        f'<rect class="bar" x="{coord(plot.xa(i * bw * sx))}" y="{coord(plot.y(c))}" '
        f'width="{coord(max(0.5, bw * sx - 1))}" height="{coord(base - plot.y(c))}">'
        f"<title>{i * bw:,.0f}-{(i + 1) * bw:,.0f} tokens: {c:,}</title></rect>"
        for i, c in enumerate(counts)
        if c
    ]
    for k, (lane, mt) in enumerate(sorted(markers, key=lambda m: m[1])):
        x = coord(plot.xa(mt * sx))
        y = 11 if k % 2 == 0 else 23
        at = sum(1 for v in values if v >= mt)
        body.append(
            f'<line class="max-tokens" data-lane="{html_esc(lane)}" x1="{x}" x2="{x}" y1="{y + 3}" '
            f'y2="{coord(base)}"><title>{html_esc(lane)}: max_tokens {mt:,} ({at:,} answers at or '
            f"over it)</title></line>"
            f'<text class="max-label" x="{x}" dx="3" y="{y}">{html_esc(lane)} {mt:,}</text>'
        )
    step = xticks_v[1] - xticks_v[0]
    x_ticks = [(v * sx, fmt_tick(v, step)) for v in xticks_v]
    return chart_frame(plot, yticks, "answers", x_ticks, "completion tokens", body, "lengths")


def _markers(r: DatasetReport, runs: list[RunRecord]) -> list[tuple[str, int]]:
    """(lane, max_tokens) of the lanes that served this dataset and those its truncated
    answers escalate to or from, as each run had them; all lanes when none is known."""
    served = {lane for lane, _ in r.lanes if lane}
    out: dict[tuple[str, int], None] = {}
    for run in runs:
        targets = {cfg.get("escalate_to") for name, cfg in run.lanes.items() if name in served}
        for name, cfg in run.lanes.items():
            mt = cfg.get("max_tokens")
            near = not served or name in served or name in targets
            near = near or cfg.get("escalate_to") in served
            if isinstance(mt, int) and near:
                out[(name, mt)] = None
    return list(out)


def _throughput(r: DatasetReport, axis: TimeAxis | None, job: JobFacts) -> str:
    """Answers per minute, on an axis whose steps are a minute or more (RATE_STEP_S)."""
    if axis is None or len(r.finished_at) < 2:
        return "<p class=dim>not enough answers for a curve</p>"
    per_min = rate_series(axis.count(r.finished_at), axis, 60.0)
    return time_chart(
        "throughput",
        axis,
        job,
        run_labels(job.runs),
        [(per_min, PALETTE[0], "")],
        "answers/min",
        DS_WIDTH,
        height=220,
    )


def _tokens(r: DatasetReport) -> str:
    """The answers' tokens: completion split into reasoning (as the server counted it) and
    content. The ledger's totals above also hold truncated answers sent again and billed
    failures."""
    completion = sum(r.completion_tokens)
    content = completion - r.reasoning_tokens
    return html_table(
        [
            (
                f"{len(r.completion_tokens):,}",
                f"{r.prompt_tokens:,}",
                f"{completion:,}",
                f"{r.reasoning_tokens:,}",
                f"{content:,}",
                f"{r.reasoning_tokens / completion:.1%}" if completion else "-",
            )
        ],
        ("answers", "prompt tok", "completion tok", "reasoning tok", "content tok", "reasoning"),
        cls="ds-tokens",
    )


def _counts(d: dict[str, int]) -> str:
    if not d:
        return "<p class=dim>none</p>"
    total = sum(d.values())
    rows = [(k, f"{n:,}", f"{n / total:.1%}") for k, n in sorted(d.items(), key=lambda kv: -kv[1])]
    return html_table(rows, ("", "count", "share"))


def _dataset_lanes(r: DatasetReport) -> str:
    if not r.lanes:
        return ""
    lanes = sorted({lane for lane, _ in r.lanes}, key=lambda n: n or "")
    rows = [
        (
            lane or "(not recorded)",
            f"{r.lanes.get((lane, False), 0) + r.lanes.get((lane, True), 0):,}",
            f"{r.lanes.get((lane, True), 0):,}",
        )
        for lane in lanes
    ]
    return (
        "<h3>lanes</h3>"
        + html_table(rows, ("lane", "answers", "of which escalated here"), cls="ds-lanes")
        + f"<p>{r.escalated_charges:,} truncated answers escalated</p>"
    )


def dataset_section(r: DatasetReport, axis: TimeAxis | None, job: JobFacts) -> str:
    p = r.progress
    lat = sorted(r.latencies)
    summary = html_table(
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
    latency = html_table(
        [tuple(f"{quantile(lat, q):.2f} s" for q in (0.5, 0.9, 0.99)) + (f"{lat[-1]:.2f} s",)]
        if lat
        else [("-", "-", "-", "-")],
        ("p50", "p90", "p99", "max"),
    )
    hist = _histogram(r.completion_tokens, _markers(r, job.runs))
    throughput = "throughput (answers per minute)" + (
        f", counted over steps of {axis.steps()}" if axis is not None else ""
    )
    return f"""
<section>
<h2>{html.escape(p.name)}</h2>
{summary}
<h3>tokens in answers</h3>{_tokens(r)}
<div class=grid>
<div><h3>{html.escape(throughput)}</h3>{_throughput(r, axis, job)}</div>
<div><h3>completion length (tokens), marked at each lane's max_tokens</h3>{hist}</div>
<div><h3>latency of answers</h3>{latency}<h3>finish reasons</h3>{_counts(r.finish_reasons)}
{_dataset_lanes(r)}</div>
<div><h3>providers that served</h3>{_counts(r.providers)}
<h3>failed attempts by class</h3>{_counts(r.errors)}</div>
</div>
</section>"""
