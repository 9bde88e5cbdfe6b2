"""The job over time: answers and tokens per second, requests in flight against each lane's
adaptive limit, dollars spent against the cap, failed attempts by class and as a share of
the attempts, 429s by lane.

Rates and shares are counted over steps of a minute or more (RATE_STEP_S): over steps of a
second, one failed attempt in a long run would read as a spike of 60 a minute. Each chart's
title says its steps, and its axis the unit.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from regen.outputs.report.axes import RATE_STEP_S, Span, TimeAxis
from regen.outputs.report.data import JobFacts, run_labels
from regen.outputs.report.markup import chart_legend, html_esc
from regen.outputs.report.svg import (
    PALETTE,
    Plot,
    Series,
    coord,
    rate_series,
    share_series,
    time_chart,
)

JOB_WIDTH = 1180
ALL_CLASSES = "#333"


def _block(title: str, legend: str, body: str) -> str:
    return f"<div class=chartbox><h3>{html_esc(title)}</h3>{legend}{body}</div>"


@dataclass(frozen=True, slots=True)
class _Charts:
    """What every chart of the job shares: its facts, the two time axes (laid out alike),
    and the run labels."""

    job: JobFacts
    axis: TimeAxis
    """Fine steps, for what is a level at each moment (in flight, dollars spent)."""
    rates: TimeAxis
    """Steps of RATE_STEP_S or more, for what is counted (rates, shares)."""
    labels: list[str]

    @property
    def steps(self) -> str:
        return f"counted over steps of {self.rates.steps()}"

    def rate_chart(self, name: str, series: Sequence[Series], y_title: str) -> str:
        return time_chart(name, self.rates, self.job, self.labels, series, y_title, JOB_WIDTH)


def job_charts(job: JobFacts, spans: list[Span]) -> str:
    """Every chart of the job over time, in the order the page shows them."""
    if not spans:
        return "<p class=dim>nothing happened yet: no answers, attempts or charges</p>"
    width = Plot(JOB_WIDTH, 1).pw
    c = _Charts(
        job,
        TimeAxis.build(spans, width),
        TimeAxis.build(spans, width, RATE_STEP_S),
        run_labels(job.runs),
    )
    answers = rate_series(c.rates.count(job.answers), c.rates, 1.0)
    return "".join(
        (
            _block(
                f"answers per second ({c.steps})",
                "",
                c.rate_chart("answers", [(answers, PALETTE[0], "")], "answers/s"),
            ),
            _tokens(c),
            _in_flight(c),
            _spend(c),
            _failures(c),
            _rate_limited(c),
        )
    )


def _tokens(c: _Charts) -> str:
    """Completion tokens per second, reasoning and content apart, and prompt tokens per second
    on a chart of their own (long prompts would dwarf the answers). An answer's tokens count
    when it was stored."""
    job, axis = c.job, c.rates
    if not job.answers:
        return _block("tokens per second", "", "<p class=dim>no answers</p>")
    completion = axis.count(job.answers, job.answer_completion)
    reasoning = axis.count(job.answers, job.answer_reasoning)
    content = [t - r for t, r in zip(completion, reasoning, strict=True)]
    prompt = axis.count(job.answers, job.answer_prompt)
    return _block(
        f"completion tokens per second in answers, reasoning and content apart ({c.steps})",
        chart_legend(
            [
                ("completion (all)", PALETTE[1], "solid"),
                ("reasoning", PALETTE[3], "dashed"),
                ("content (completion less reasoning)", PALETTE[0], "dotted"),
            ]
        ),
        c.rate_chart(
            "tokens",
            [
                (rate_series(completion, axis, 1.0), PALETTE[1], ""),
                (rate_series(reasoning, axis, 1.0), PALETTE[3], "6 3"),
                (rate_series(content, axis, 1.0), PALETTE[0], "1 3"),
            ],
            "completion tokens/s",
        ),
    ) + _block(
        f"prompt tokens per second in answers ({c.steps})",
        "",
        c.rate_chart(
            "prompt-tokens", [(rate_series(prompt, axis, 1.0), PALETTE[2], "")], "prompt tokens/s"
        ),
    )


def _in_flight(c: _Charts) -> str:
    """Each lane's requests on the wire, adaptive limit and concurrency, as means over each
    (fine) step of the samples taken about once a second."""
    job, axis = c.job, c.axis
    lanes = sorted({p.lane for p in job.timeline})
    if not lanes:
        return _block(
            "requests in flight",
            "",
            "<p class=dim>no timeline: this state.db was written by a regen that did not "
            "sample lanes (or no run has started since)</p>",
        )
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
    series: list[Series] = []
    legend = []
    for i, lane in enumerate(lanes):
        fl, lim, conc, cnt = sums[lane]
        color = PALETTE[i % len(PALETTE)]
        series.append(([v / k if k else None for v, k in zip(fl, cnt, strict=True)], color, ""))
        series.append(([v / k if k else None for v, k in zip(lim, cnt, strict=True)], color, "6 3"))
        series.append(([v if k else None for v, k in zip(conc, cnt, strict=True)], color, "1 3"))
        legend += [
            (f"{lane}: in flight", color, "solid"),
            (f"{lane}: adaptive limit", color, "dashed"),
            (f"{lane}: concurrency", color, "dotted"),
        ]
    return _block(
        "requests in flight against each lane's adaptive limit (means over each step)",
        chart_legend(legend),
        time_chart("in-flight", axis, job, c.labels, series, "requests", JOB_WIDTH),
    )


def _spend(c: _Charts) -> str:
    """Dollars spent, cumulative, against each run's cap."""
    job, axis = c.job, c.axis
    spent: list[float | None] = [job.spent_by(b.until) for b in axis.buckets()]
    caps = [(r, r.max_cost_usd) for r in job.runs if r.max_cost_usd is not None]

    def cap_lines(plot: Plot) -> list[str]:
        out = []
        for r, cap in caps:
            assert cap is not None
            x0 = plot.xa(axis.x(r.started_at))
            i = axis._span_of(r.started_at)
            x1 = plot.xa(axis.x0[i] + axis.widths[i])
            y = coord(plot.y(cap))
            out.append(
                f'<line class="cap" x1="{coord(x0)}" x2="{coord(x1)}" y1="{y}" y2="{y}">'
                f"<title>dollar cap ${cap:,.2f}</title></line>"
                f'<text class="cap-label" x="{coord(x1 - 3)}" y="{y}" dy="-4" '
                f'text-anchor="end">cap ${cap:,.2f}</text>'
            )
        return out

    return _block(
        "dollars spent (cumulative) against the job's dollar cap",
        chart_legend(
            [("spent", PALETTE[1], "solid")] + ([("cap", "#c22", "dashed")] if caps else [])
        ),
        time_chart(
            "spend",
            axis,
            job,
            c.labels,
            [(spent, PALETTE[1], "")],
            "USD spent (cumulative)",
            JOB_WIDTH,
            extra_top=max((cap for _, cap in caps if cap is not None), default=0.0),
            extra=cap_lines,
            prefix="$",
        ),
    )


def _failures(c: _Charts) -> str:
    """Failed attempts per minute by class, and as a share of the attempts started in each
    step (all classes, and each class apart)."""
    job, axis = c.job, c.rates
    classes = sorted({cls for _, cls, _ in job.failures})
    if not classes:
        return _block("failed attempts by class", "", "<p class=dim>no failed attempts</p>")
    color_of = {cls: PALETTE[(k + 2) % len(PALETTE)] for k, cls in enumerate(classes)}
    by_class = {cls: array("d") for cls in classes}
    for t, cls, _ in job.failures:
        by_class[cls].append(t)
    failed = {cls: axis.count(by_class[cls]) for cls in classes}
    per_min = [(rate_series(failed[cls], axis, 60.0), color_of[cls], "") for cls in classes]
    out = _block(
        f"failed attempts per minute, by class ({c.steps})",
        chart_legend([(cls, color_of[cls], "solid") for cls in classes]),
        c.rate_chart("errors", per_min, "failed attempts/min"),
    )
    if not job.attempts:
        return out + _block(
            "failed attempts as a share of the attempts started",
            "",
            "<p class=dim>no share: this state.db was written by a regen that did not record "
            "each attempt's lane, and the attempts are read with it</p>",
        )
    started = axis.count(job.attempts)
    every = [sum(n) for n in zip(*failed.values(), strict=True)]
    shares: list[Series] = [(share_series(every, started), ALL_CLASSES, "")]
    shares.extend((share_series(failed[cls], started), color_of[cls], "4 2") for cls in classes)
    overall = len(job.failures) / len(job.attempts)
    return out + _block(
        f"failed attempts as a share of the attempts started ({c.steps}; "
        f"{overall:.1%} of all attempts)",
        chart_legend(
            [("all classes", ALL_CLASSES, "solid")]
            + [(cls, color_of[cls], "dashed") for cls in classes]
        ),
        c.rate_chart("failure-share", shares, "% of attempts started that failed"),
    )


def _rate_limited(c: _Charts) -> str:
    """429s per minute, by the lane they came back on."""
    job, axis = c.job, c.rates
    lanes = sorted({lane or "" for _, lane in job.rate_limited})
    if not lanes:
        return _block("429s (rate limited)", "", "<p class=dim>no 429s</p>")
    color_of = {lane: PALETTE[k % len(PALETTE)] for k, lane in enumerate(lanes)}
    by_lane = {lane: array("d") for lane in lanes}
    for t, lane_or_none in job.rate_limited:
        by_lane[lane_or_none or ""].append(t)
    series: list[Series] = [
        (rate_series(axis.count(by_lane[lane]), axis, 60.0), color_of[lane], "") for lane in lanes
    ]
    return _block(
        f"429s (rate limited) per minute, by lane ({c.steps})",
        chart_legend([(lane or "(lane not recorded)", color_of[lane], "solid") for lane in lanes]),
        c.rate_chart("429s", series, "429s/min"),
    )
