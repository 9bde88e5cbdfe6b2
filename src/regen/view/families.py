"""What `regen families` shows: each model family `[reconstruct] family` names, how its
completions are rebuilt, what was checked against what, and what `auto` looks for."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from regen.reconstruct.families import FAMILIES

AUTO = (
    'family = "auto" reads the model\'s chat template and takes the first family below '
    "whose `auto looks for` texts it all holds; a template that holds none of them gets "
    "the generic `template` family"
)


def family_rows() -> list[dict[str, Any]]:
    """One row per family, as `regen families --json` prints them."""
    return [
        {
            "family": f.name,
            "completion": "hand-written grammar"
            if f.layout is not None
            else f"{f.encoder_package}, the publisher's encoder"
            if f.encoder
            else "chat template",
            "why_grammar": " ".join(f.why_grammar.split()),
            "stop": None
            if f.layout is not None
            else f.appended_stop(False) or (list(f.stop) or ["eos_token"])[0],
            "stop_after_calls": f.append_stop_after_calls or None,
            "arguments": f.arguments,
            "parse_back": f.syntax,
            "verified": " ".join(f.verified.split()),
            "assumed": " ".join(f.assumed.split()),
            "auto_detects": list(f.detect),
        }
        for f in FAMILIES.values()
    ]


def show_families(console: Console, rows: list[dict[str, Any]]) -> None:
    """A table on a terminal; piped, one family a paragraph, wrapped at 80 columns."""
    if not console.is_terminal:
        families_text(rows)
        return
    console.print(AUTO, markup=False, highlight=False)
    table = Table(title="model families ([reconstruct] family)")
    for column in ("family", "completion", "verified against", "still assumed"):
        table.add_column(column, overflow="fold")
    for r in rows:
        how = str(r["completion"]) + (f" ({r['why_grammar']})" if r["why_grammar"] else "")
        cells = (how, r["verified"], r["assumed"] or "-")
        table.add_row(r["family"], *(escape(c) for c in cells))
    console.print(table)


def families_text(rows: list[dict[str, Any]]) -> None:
    """`regen families` piped: plain paragraphs of at most 80 columns."""
    print(textwrap.fill(AUTO, 80))
    for r in rows:
        how = str(r["completion"]) + (f" ({r['why_grammar']})" if r["why_grammar"] else "")
        print(f"\n{r['family']}")
        for label, text in (
            ("completion", how),
            ("auto looks for", ", ".join(repr(d) for d in r["auto_detects"]) or "-"),
            ("verified against", r["verified"] or "-"),
            ("still assumed", r["assumed"] or "-"),
        ):
            print(
                textwrap.fill(f"{label}: {text}", 80, initial_indent="  ", subsequent_indent="    ")
            )
