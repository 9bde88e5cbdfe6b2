"""`regen plan` on a terminal: the plan's tables and lines, drawn from its data (run/planner.py's
`plan_json`, what `regen plan --json` prints), as `view/inspection.py` draws `regen inspect`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from regen.engine.eta import format_duration
from regen.state.sources import BadRowGroup
from regen.view.progress import bad_rows_table, format_tokens

Interval = Mapping[str, float]
"""A p10-mean-p90 interval as the plan's data has it (run/forecast.py's `Interval`)."""


def show_plan(
    console: Console, plan: Mapping[str, Any], verdict: Sequence[str], pilot: Sequence[str]
) -> None:
    """`regen plan` for a person: the tables, then what was spent, what stops the job, the
    verdict (run/planner.py's `verdict_lines`), the notes and what the pilot measured (its
    lines and closing notes)."""
    for table in plan_tables(plan):
        console.print(table)
    if plan["bad_row_reasons"]:
        groups = [BadRowGroup(**g) for g in plan["bad_row_reasons"]]
        console.print(bad_rows_table(groups))
    console.print(f"spent so far: ${plan['spent_usd']:.4f}", markup=False)
    if plan["credit_usd"] is not None:
        console.print(f"credit remaining: ${plan['credit_usd']:.2f}", markup=False)
    console.print(f"stop: {plan['job']['stop']}", markup=False, soft_wrap=True)
    for line in verdict:
        console.print(line, markup=False, soft_wrap=True)
    if plan["coverage"]:
        console.print(plan["coverage"], markup=False, soft_wrap=True)
    for line in plan["job"]["assumptions"]:
        console.print(f"note: {line}", markup=False, soft_wrap=True)
    for line in pilot:
        console.print(line, markup=False, soft_wrap=True)


def _usd(iv: Interval | None) -> str:
    if iv is None:
        return "?"
    return f"{iv['mean']:.4f} ({iv['p10']:.4f}-{iv['p90']:.4f})"


def _count(iv: Interval) -> str:
    return f"{iv['mean']:.0f} ({iv['p10']:.0f}-{iv['p90']:.0f})" if iv["mean"] > 0 else "0"


def _time(iv: Interval | None) -> str:
    if iv is None:
        return "?"
    mean, p10, p90 = (format_duration(iv[k]) for k in ("mean", "p10", "p90"))
    return f"{mean} ({p10}-{p90})"


def _saved(caching: Mapping[str, Any]) -> float:
    """What the cache saves on every item to come (run/forecast.py's `CacheSaving.saved_usd`,
    a property the plan's data leaves out)."""
    return float(caching["without_usd"] - caching["with_usd"])


def plan_tables(plan: Mapping[str, Any]) -> list[Table]:
    """`regen plan`: per dataset and lane what is still to come (p10-p90 in brackets), then
    the lanes and the job."""
    return [_flows_table(plan), _datasets_table(plan), _lanes_table(plan)]


def _flows_table(p: Mapping[str, Any]) -> Table:
    """A row per dataset and lane: passages, attempts, tokens, cost and time to come."""
    flows = Table(title="plan: per dataset and lane, from here (p10-p90)", title_justify="left")
    cols = ("dataset", "lane", "passages", "attempts", "escalate", "prompt tok", "compl tok")
    for col in (*cols, "$", "time", "from"):
        flows.add_column(col, justify="left" if col in ("dataset", "lane", "from") else "right")
    for f in p["flows"]:
        flows.add_row(
            f["dataset"],
            f["lane"],
            f"{f['passages']:.0f}",
            f"{f['attempts']:.0f}",
            _count(f["escalations"]),
            format_tokens(round(f["prompt_tokens"])),
            format_tokens(round(f["completion_tokens"])),
            _usd(f["cost_usd"]),
            _time(f["time_s"]),
            f["basis"],
        )
    return flows


def _datasets_table(p: Mapping[str, Any]) -> Table:
    """A row per dataset (items, what will be sent, cost, when done, what stops it), then
    the job's totals."""
    datasets = Table(title="per dataset", title_justify="left")
    cols = ("dataset", "items", "pending", "to send", "attempts", "$", "cache saves", "done in")
    for col in (*cols, "stops"):
        datasets.add_column(col, justify="left" if col in ("dataset", "stops") else "right")
    caching = p["job"]["caching"]
    for d in p["datasets"]:
        datasets.add_row(
            d["name"],
            str(d["items"]),
            str(d["pending"]),
            str(d["sent"]),
            f"{d['attempts']:.0f}",
            _usd(d["cost_usd"]),
            "?" if caching is None else f"{caching['by_dataset'].get(d['name'], 0.0):.4f}",
            _time(d["done_in_s"]),
            d["stop"] or "",
        )
    datasets.add_section()
    datasets.add_row(
        "job",
        str(sum(d["items"] for d in p["datasets"])),
        str(sum(d["pending"] for d in p["datasets"])),
        str(sum(d["sent"] for d in p["datasets"])),
        f"{sum(d['attempts'] for d in p['datasets']):.0f}",
        _usd(p["job"]["cost_usd"]),
        "?" if caching is None else f"{_saved(caching):.4f}",
        _time(p["job"]["time_s"]),
        "",
        style="bold",
    )
    return datasets


def _lanes_table(p: Mapping[str, Any]) -> Table:
    """A row per lane: its concurrency, what it may keep on the wire, passages, cost, time."""
    lanes = Table(title="per lane", title_justify="left")
    for col in ("lane", "concurrency", "on the wire", "passages", "escalated in", "$", "time"):
        lanes.add_column(col, justify="left" if col == "lane" else "right")
    for lane in p["lanes"]:
        lanes.add_row(
            lane["name"],
            str(lane["concurrency"]),
            "-" if lane["on_wire"] is None else f"{lane['on_wire']:.0f}",
            f"{lane['passages']:.0f}",
            f"{lane['escalations_in']['mean']:.0f}",
            _usd(lane["cost_usd"]),
            _time(lane["time_s"]),
        )
    return lanes
