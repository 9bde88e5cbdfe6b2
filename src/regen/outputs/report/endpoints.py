"""The endpoints section: per endpoint of the job, the answers it gave, their tokens
(reasoning and content apart), their cost and latency, its failed attempts by class and its
outages (times a run took it out of its pool, each counted once however many requests it
failed); with more than one endpoint, their completion tokens per second side by side.
Attempts and outages name their endpoint from schema 12 on; older ones are not split.
"""

from __future__ import annotations

from regen.measures import quantile
from regen.outputs.report.axes import RATE_STEP_S, Span, TimeAxis
from regen.outputs.report.data import EndpointReport, JobFacts, run_labels
from regen.outputs.report.job_charts import JOB_WIDTH
from regen.outputs.report.markup import chart_legend, html_esc, html_table
from regen.outputs.report.svg import PALETTE, Plot, Series, rate_series, time_chart


def _name(e: EndpointReport) -> str:
    return e.name or "(not recorded)"


def _outages(e: EndpointReport) -> str:
    """How many, how long in all (one a run never saw end counts as nothing), re-sent."""
    if not e.outages:
        return "0"
    down = sum(o.ended_at - o.started_at for o in e.outages if o.ended_at is not None)
    resent = sum(o.resent for o in e.outages)
    return f"{len(e.outages)} ({down:,.0f} s out, {resent:,} re-sent)"


def _row(e: EndpointReport) -> tuple[str, ...]:
    completion = sum(e.completion_tokens)
    lat = sorted(e.latencies)
    mean = sum(lat) / len(lat) if lat else 0.0
    failed = sum(e.errors.values())
    by_class = ", ".join(f"{c} {n}" for c, n in sorted(e.errors.items(), key=lambda kv: -kv[1]))
    return (
        _name(e),
        f"{len(lat):,}",
        f"{e.prompt_tokens:,}",
        f"{completion:,}",
        f"{e.reasoning_tokens:,}",
        f"{completion - e.reasoning_tokens:,}",
        f"${e.cost_usd:,.4f}",
        f"{mean:.2f} s",
        f"{quantile(lat, 0.5):.2f} s",
        f"{quantile(lat, 0.9):.2f} s",
        f"{failed:,}" + (f" ({by_class})" if by_class else ""),
        _outages(e),
    )


def _throughput(endpoints: list[EndpointReport], job: JobFacts, spans: list[Span]) -> str:
    """Completion tokens per second of each endpoint, counted over steps of a minute or more."""
    axis = TimeAxis.build(spans, Plot(JOB_WIDTH, 1).pw, RATE_STEP_S)
    series: list[Series] = []
    legend = []
    for k, e in enumerate(endpoints):
        color = PALETTE[k % len(PALETTE)]
        tokens = axis.count(e.finished_at, e.completion_tokens)
        series.append((rate_series(tokens, axis, 1.0), color, ""))
        legend.append((_name(e), color, "solid"))
    title = f"completion tokens per second, by endpoint (counted over steps of {axis.steps()})"
    svg = time_chart(
        "endpoint-tokens",
        axis,
        job,
        run_labels(job.runs),
        series,
        "completion tokens/s",
        JOB_WIDTH,
    )
    return f"<div class=chartbox><h3>{html_esc(title)}</h3>{chart_legend(legend)}{svg}</div>"


def endpoint_section(endpoints: list[EndpointReport], job: JobFacts, spans: list[Span]) -> str:
    """The table of endpoints, and their throughput when there are several."""
    if not endpoints:
        return ""
    table = html_table(
        [_row(e) for e in endpoints],
        (
            "endpoint",
            "answers",
            "prompt tok",
            "completion tok",
            "reasoning tok",
            "content tok",
            "cost of answers",
            "mean latency",
            "p50 latency",
            "p90 latency",
            "failed attempts",
            "outages",
        ),
        cls="endpoints",
    )
    note = (
        "<p class=dim>Tokens and cost are of answers: truncated answers sent again on a longer "
        "lane and billed failed attempts are in the ledger's totals. An outage is a run taking "
        "the endpoint out of its pool (its server down or loading) until its health probe "
        "passed; its failed requests went to the other servers (re-sent).</p>"
    )
    chart = _throughput(endpoints, job, spans) if len(endpoints) > 1 and spans else ""
    return f"<section class=endpoints><h3>endpoints</h3>{table}{note}{chart}</section>"
