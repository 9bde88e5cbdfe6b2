"""What `regen run` shows at its end: the summary's table, where the output is, the money's
lines, the endpoints' table of a pool, then the notes and how the run ended."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from regen.state.spend import EndpointTotals
from regen.view.progress import SummaryView, endpoints_table


def show_run_end(
    console: Console,
    summary: SummaryView,
    out_dir: Path,
    money: Sequence[str],
    endpoints: Sequence[EndpointTotals],
    notes: Sequence[str],
) -> None:
    """Print the run's end (its lines as run/summary.py words them) on `console`."""
    console.print(summary)
    console.print(f"output: {out_dir}  (state.db, run.log, report.html, export/*.jsonl)")
    print_lines(money, console)
    if endpoints:
        console.print(endpoints_table(endpoints))
    print_lines(notes, console)


def print_lines(lines: Sequence[str], console: Console) -> None:
    """Plain lines, as written: no markup, no highlighting, never cut."""
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def demo_audit_line(overall: dict[str, Any], out: Path) -> str:
    """`regen demo`'s last line: how its answers' ids held against the bills (the audit's
    totals, outputs/audit.py's `audit_json`), and the commands that show more."""
    return (
        f"audit: {overall['samples']} answers rebuilt as Kimi-K2.5 token ids; "
        f"{overall['match_share']:.1%} match the billed completion tokens, "
        f"{overall['prompt_match_share']:.1%} the prompt tokens, "
        f"{overall['problems'].get('reparse_mismatch', 0)} do not parse back "
        f"(the simulator bills from the published chat templates; "
        f"regen audit {out}; regen export {out} --format tokenized)"
    )
