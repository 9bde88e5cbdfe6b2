"""What `regen export` shows: per dataset what it wrote and dropped, its notes, and where to
find and load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def show_export(console: Console, fmt: str, to: Path, manifest: dict[str, Any]) -> None:
    """What the export wrote, per dataset, its notes, and where to find and load it."""
    table = Table(title=f"export {fmt} -> {to}", title_justify="left")
    for col in ("dataset", "train", "validation", "completion tok", "cost $", "dropped"):
        table.add_column(col, justify="left" if col in ("dataset", "dropped") else "right")
    for name, d in manifest["datasets"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in d["dropped"].items()) or "-"
        table.add_row(
            name,
            str(d["samples"]["train"]),
            str(d["samples"]["validation"]),
            str(d["completion_tokens"]),
            f"{d['cost_usd']:.4f}",
            dropped,
        )
    console.print(table)
    for note in manifest.get("notes", []):  # also on the card
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"manifest: {to / 'manifest.json'}", markup=False)
    console.print(
        f"load it with datasets.load_dataset({str(to)!r}) (card: {to / 'README.md'})",
        markup=False,
        highlight=False,
    )
