"""What `regen audit` shows: its table (per dataset, then the job's totals), the samples it
names under it, and the job-wide limits broken."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from regen.reconstruct import TargetSpec
from regen.safe import printable


def show_audit(console: Console, data: dict[str, Any], spec: TargetSpec, broken: list[str]) -> None:
    """The audit (outputs/audit.py's `audit_json`) for a person."""
    console.print(audit_table(data, spec))
    for d in data["datasets"]:
        print_audit_lines(d, console)
    for b in broken:
        console.print(f"audit failed: {b}", markup=False)


AUDIT_COLUMNS = (
    "dataset",
    "samples",
    "cut",
    "exact ids",
    "mean |diff|",
    "max |diff|",
    "matches",
    "prompt |diff|",
    "failed",
)


def audit_table(data: dict[str, Any], spec: TargetSpec) -> Table:
    """The audit's summary: one row per dataset, then the job's totals."""
    table = Table(title=f"audit ({spec.family}, tokenizer {spec.tokenizer})")
    for col in (*AUDIT_COLUMNS, "problems"):
        table.add_column(col, justify="left" if col in ("dataset", "problems") else "right")
    for d in (*data["datasets"], data["overall"]):
        table.add_row(
            d["name"],
            str(d["samples"]),
            str(d["truncated_left_out"]),
            str(d["exact_ids"]),
            f"{d['mean_abs_diff']:.3f}",
            str(d["max_abs_diff"]),
            f"{d['match_share']:.1%}",
            f"{d['prompt_mean_abs_diff']:.3f}",
            str(d["failed"]),
            ", ".join(f"{k} {v}" for k, v in d["problems"].items()) or "-",
        )
    return table


def print_audit_lines(d: dict[str, Any], console: Console) -> None:
    """One dataset's named samples under the table: worst, notes, failing, server-id checks."""
    # An item id, a rebuild's reason or a divergence may quote a row or a server: one
    # line each, control characters escaped.
    for w in d["worst"][:3]:
        console.print(
            printable(
                f"worst {d['name']}: {w['item_id']} rebuilt {w['rebuilt']} "
                f"billed {w['billed']} (prompt {w['prompt_diff']:+d})"
            ),
            markup=False,
        )
    for n in d["notes"]:
        line = f"note {d['name']}: {n['item_id']}: {n['note']}"
        console.print(printable(line), markup=False, soft_wrap=True)
    for f in d["failing"]:  # every failing sample, so none is failed unnamed
        why = f" ({'; '.join(f['details'])})" if f["details"] else ""
        line = f"failing {d['name']}: {f['item_id']}: {', '.join(f['problems'])}{why}"
        console.print(printable(line), markup=False, soft_wrap=True)
    if d["server_ids_checked"]:
        console.print(
            f"server ids {d['name']}: the rebuild equals the server's ids in "
            f"{d['server_ids_match_share']:.1%} of {d['server_ids_checked']} answers",
            markup=False,
        )
    for what, key, detail in (
        ("rebuild fails its check", "reparse", "first_difference"),
        ("rebuild differs from the server", "server_ids_divergences", "first_divergence"),
    ):
        for r in d[key][:3]:
            line = f"{what} {d['name']}: {r['item_id']}: {r[detail]}"
            console.print(printable(line), markup=False)
