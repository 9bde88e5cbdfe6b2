"""The job-level section: the table of runs, the lanes and their escalations, and the job
over time (answers per second, requests in flight against each lane's adaptive limit,
dollars spent against the cap, failed attempts by class, 429s by lane).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from regen.outputs.report.axes import IDLE_GAP_S, Span, TimeAxis, activity_spans, fmt_duration, utc
from regen.outputs.report.data import DatasetReport, JobFacts, Report, run_labels
from regen.outputs.report.markup import _esc, _legend, _table
from regen.outputs.report.svg import PALETTE, Plot, _f, _rates, _time_chart

JOB_WIDTH = 1180


def _job_charts(job: JobFacts, spans: list[Span]) -> str:
    if not spans:
        return "<p class=dim>nothing happened yet: no answers, attempts or charges</p>"
    axis = TimeAxis.build(spans, Plot(JOB_WIDTH, 1).pw)
    labels = run_labels(job.runs)
    blocks: list[str] = []

    def block(title: str, legend: str, svg: str) -> None:
        blocks.append(f"<div class=chartbox><h3>{_esc(title)}</h3>{legend}{svg}</div>")

    answers = _rates(axis.count(job.answers), axis, 1.0)
    block(
        "answers per second",
        "",
        _time_chart(
            "answers", axis, job, labels, [(answers, PALETTE[0], "")], "answers/s", JOB_WIDTH
        ),
    )

    lanes = sorted({p.lane for p in job.timeline})
    if lanes:
        bucket = axis.counter()
        n = axis.n_buckets
        sums = {lane: ([0.0] * n, [0.0] * n, [0.0] * n, [0] * n) for lane in lanes}
        for p in job.timeline:
            b = bucket(p.t)
            if b < 0:
                continue
            fl, lim, conc, cnt = sums[p.lane]
            fl[b] += p.in_flight
            lim[b] += p.limit
            conc[b] = max(conc[b], p.concurrency)
            cnt[b] += 1
        series: list[tuple[Sequence[float | None], str, str]] = []
        legend = []
        for k, lane in enumerate(lanes):
            fl, lim, conc, cnt = sums[lane]
            color = PALETTE[k % len(PALETTE)]
            series.append(([f / c if c else None for f, c in zip(fl, cnt, strict=True)], color, ""))
            series.append(
                ([v / c if c else None for v, c in zip(lim, cnt, strict=True)], color, "6 3")
            )
            series.append(
                ([v if c else None for v, c in zip(conc, cnt, strict=True)], color, "1 3")
            )
            legend += [
                (f"{lane}: in flight", color, "solid"),
                (f"{lane}: adaptive limit", color, "dashed"),
                (f"{lane}: concurrency", color, "dotted"),
            ]
        block(
            "requests in flight against each lane's adaptive limit (means over each step)",
            _legend(legend),
            _time_chart("in-flight", axis, job, labels, series, "requests", JOB_WIDTH),
        )
    else:
        block(
            "requests in flight",
            "",
            "<p class=dim>no timeline: this state.db was written by a regen that did not "
            "sample lanes (or no run has started since)</p>",
        )

    # Dollars spent, cumulative, against each run's cap.
    spent: list[float | None] = [job.spent_by(b.until) for b in axis.buckets()]
    caps = [(r, r.max_cost_usd) for r in job.runs if r.max_cost_usd is not None]

    def cap_lines(plot: Plot) -> list[str]:
        out = []
        for r, cap in caps:
            assert cap is not None
            x0 = plot.xa(axis.x(r.started_at))
            i = axis._span_of(r.started_at)
            x1 = plot.xa(axis.x0[i] + axis.widths[i])
            y = _f(plot.y(cap))
            out.append(
                f'<line class="cap" x1="{_f(x0)}" x2="{_f(x1)}" y1="{y}" y2="{y}">'
                f"<title>dollar cap ${cap:,.2f}</title></line>"
                f'<text class="cap-label" x="{_f(x1 - 3)}" y="{y}" dy="-4" '
                f'text-anchor="end">cap ${cap:,.2f}</text>'
            )
        return out

    block(
        "dollars spent (cumulative) against the job's dollar cap",
        _legend([("spent", PALETTE[1], "solid")] + ([("cap", "#c22", "dashed")] if caps else [])),
        _time_chart(
            "spend",
            axis,
            job,
            labels,
            [(spent, PALETTE[1], "")],
            "USD spent (cumulative)",
            JOB_WIDTH,
            extra_top=max((c for _, c in caps if c is not None), default=0.0),
            extra=cap_lines,
            prefix="$",
        ),
    )

    classes = sorted({c for _, c, _ in job.failures})
    if classes:
        color_of = {c: PALETTE[(k + 2) % len(PALETTE)] for k, c in enumerate(classes)}
        by_class = {c: array("d") for c in classes}
        for t, c, _ in job.failures:
            by_class[c].append(t)
        series = [(_rates(axis.count(by_class[c]), axis, 60.0), color_of[c], "") for c in classes]
        block(
            "failed attempts by class",
            _legend([(c, color_of[c], "solid") for c in classes]),
            _time_chart("errors", axis, job, labels, series, "failed attempts/min", JOB_WIDTH),
        )
    else:
        block("failed attempts by class", "", "<p class=dim>no failed attempts</p>")

    limited_lanes = sorted({lane or "" for _, lane in job.rate_limited})
    if limited_lanes:
        color_of = {lane: PALETTE[k % len(PALETTE)] for k, lane in enumerate(limited_lanes)}
        by_lane = {lane: array("d") for lane in limited_lanes}
        for t, lane_or_none in job.rate_limited:
            by_lane[lane_or_none or ""].append(t)
        series = [
            (_rates(axis.count(by_lane[lane]), axis, 60.0), color_of[lane], "")
            for lane in limited_lanes
        ]
        block(
            "429s (rate limited), by lane",
            _legend(
                [(lane or "(lane not recorded)", color_of[lane], "solid") for lane in limited_lanes]
            ),
            _time_chart("429s", axis, job, labels, series, "429s/min", JOB_WIDTH),
        )
    else:
        block("429s (rate limited)", "", "<p class=dim>no 429s</p>")
    return "".join(blocks)


def _runs_table(job: JobFacts) -> str:
    if not job.runs:
        return ""
    rows = []
    for r, label, answers, usd, last in zip(
        job.runs, run_labels(job.runs), job.run_answers, job.run_usd, job.run_last, strict=True
    ):
        end = r.ended_at if r.ended_at is not None else last
        lanes = ", ".join(
            f"{name} ({cfg.get('max_tokens')} tok, x{cfg.get('concurrency')})"
            for name, cfg in sorted(r.lanes.items())
        )
        rows.append(
            (
                label,
                utc(r.started_at) + " UTC",
                fmt_duration(max(0.0, end - r.started_at)),
                f"{answers:,}",
                f"${usd:,.4f}",
                "-" if r.max_cost_usd is None else f"${r.max_cost_usd:,.2f}",
                lanes,
                r.stop_reason or ("(killed)" if r.ended_at is None else "done"),
            )
        )
    return _table(
        rows,
        ("run", "started", "lasted", "answers", "spent", "cap", "lanes", "stopped"),
        cls="runs",
    )


def _lanes_table(job: JobFacts, datasets: list[DatasetReport]) -> str:
    if not job.recorded:
        return ""
    config: dict[str, dict[str, object]] = {}
    for run in job.runs:  # the latest run's settings win
        config.update(run.lanes)
    answered: dict[str | None, int] = {}
    escalated: dict[str | None, int] = {}
    for r in datasets:
        for (lane, esc), n in r.lanes.items():
            answered[lane] = answered.get(lane, 0) + n
            if esc:
                escalated[lane] = escalated.get(lane, 0) + n
    names: list[str | None] = list(config)
    names += sorted(
        {n for n in (*answered, *job.lane_attempts) if n not in config}, key=lambda n: n or ""
    )
    if not names:
        return ""
    rows = []
    for name in names:
        cfg = config.get(name or "", {})
        rows.append(
            (
                name or "(not recorded)",
                str(cfg.get("max_tokens", "-")),
                str(cfg.get("concurrency", "-")),
                str(cfg.get("escalate_to") or "-"),
                f"{answered.get(name, 0):,}",
                f"{escalated.get(name, 0):,}",
                f"{job.lane_attempts.get(name, 0):,}",
                f"{job.lane_429s.get(name, 0):,}",
            )
        )
    table = _table(
        rows,
        (
            "lane",
            "max_tokens",
            "concurrency",
            "escalates to",
            "answers",
            "of which escalated here",
            "attempts",
            "429s",
        ),
        cls="lanes",
    )
    note = (
        f"<p class=escalations>{job.escalated_charges:,} truncated answers were escalated "
        f"(re-sent on a longer lane; ${job.escalated_usd:,.4f} paid for the truncated ones); "
        f"{sum(escalated.values()):,} of them are answered.</p>"
    )
    return table + note


def _job_section(report: Report) -> str:
    job = report.job
    spans = activity_spans(job)
    note = ""
    if not job.recorded:
        note = (
            "<p class=note>This state.db was written by a regen that did not record runs: "
            "the charts below come from answers, failed attempts and charges alone (no run "
            "marks, caps, lanes or in-flight timeline); stretches over "
            f"{IDLE_GAP_S / 60:.0f} minutes with nothing happening are left out.</p>"
        )
    elif not job.runs:
        note = "<p class=note>No runs recorded yet.</p>"
    return (
        f"<section class=job>{note}{_runs_table(job)}"
        f"<h3>lanes</h3>{_lanes_table(job, report.datasets) or '<p class=dim>none recorded</p>'}"
        f"{_job_charts(job, spans)}</section>"
    )
