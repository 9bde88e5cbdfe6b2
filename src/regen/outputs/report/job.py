"""The job-level section: the table of runs, the lanes and their escalations, and the job
over time (`job_charts`).
"""

from __future__ import annotations

from regen.measures import format_duration
from regen.outputs.report.axes import IDLE_GAP_S, activity_spans, utc
from regen.outputs.report.data import DatasetReport, JobFacts, Report, run_labels
from regen.outputs.report.job_charts import job_charts
from regen.outputs.report.markup import html_table


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
                format_duration(max(0.0, end - r.started_at), "prose"),
                f"{answers:,}",
                f"${usd:,.4f}",
                "-" if r.max_cost_usd is None else f"${r.max_cost_usd:,.2f}",
                lanes,
                r.ending(live=r.id == job.live_run),
            )
        )
    return html_table(
        rows,
        ("run", "started", "lasted", "answers", "spent", "cap", "lanes", "ended"),
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
    table = html_table(
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


def job_section(report: Report) -> str:
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
        f"{job_charts(job, spans)}</section>"
    )
