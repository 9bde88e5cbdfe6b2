"""Small HTML pieces shared by the chart, job and dataset sections: escaping, tables and
chart legends."""

from __future__ import annotations

import html
from collections.abc import Sequence


def html_esc(s: str) -> str:
    return html.escape(s, quote=True)


def html_table(rows: Sequence[tuple[str, ...]], head: tuple[str, ...], cls: str = "") -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{header}</tr></thead><tbody>{cells}</tbody></table>"


def chart_legend(items: list[tuple[str, str, str]]) -> str:
    """(label, colour, line style: solid/dashed/dotted) as HTML under a chart title."""
    if not items:
        return ""
    spans = "".join(
        f'<span><i style="border-top:2px {style} {color}"></i>{html_esc(label)}</span>'
        for label, color, style in items
    )
    return f"<div class=legend>{spans}</div>"
