"""`regen inspect` on a terminal: a dataset's rows and the requests a run would build from
them (run/inspection.py), each row in a panel."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from regen.safe import printable


def _clip(text: str, width: int = 160) -> str:
    one = printable(text)  # a dataset's text: one line, escapes shown
    return one if len(one) <= width else f"{one[: width - 1]}…"


def _message_line(m: dict[str, Any]) -> str:
    parts = [_clip(str(m.get("content") or ""), 120)]
    reasoning = str(m.get("reasoning") or m.get("reasoning_content") or "")
    if reasoning:
        parts.insert(0, f"[reasoning {len(reasoning)} chars]")
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function", {})
        parts.append(f"→ {fn.get('name')}({_clip(str(fn.get('arguments')), 60)}) id={tc.get('id')}")
    if m.get("tool_call_id"):
        parts.append(f"(answers {m['tool_call_id']})")
    return " ".join(p for p in parts if p)


def inspection_view(ins: dict[str, Any]) -> Group:
    """The rows and their requests (run/inspection.py's `inspection_json`), for a terminal."""
    parts: list[Any] = [
        Text(f"dataset {ins['dataset']}: format {ins['format']}, mode {ins['mode']}", style="bold")
    ]
    if not ins["rows"]:
        parts.append(Text("no rows (after filter and sample)"))
    for row in ins["rows"]:
        body: list[Any] = []
        if row["source"] is not None:
            source = list(row["source"].items())[:8]
            fields = ", ".join(f"{k}={_clip(repr(v), 50)}" for k, v in source)
            body.append(Text(f"source: {fields}", style="dim"))
        if row["reason"]:
            body.append(Text(f"not used: {row['reason']}", style="red"))
        for note in row["notes"]:
            body.append(Text(f"note: {note}", style="yellow"))
        for item in row["requests"]:
            body += [Text(_request_head(item), style="bold"), _messages_table(item["body"])]
        parts.append(Panel(Group(*body), title=f"row {row['row_index']}", title_align="left"))
    return Group(*parts)


def _request_head(item: dict[str, Any]) -> str:
    request = item["body"]
    head = (
        f"request for turn {item['turn_index']}: lane {item['lane'] or '(none: not sent)'}, "
        f"~{item['prompt_tokens_est']} prompt tokens, max_tokens "
        f"{request.get('max_tokens')}, {len(request.get('tools') or [])} tools"
    )
    if item["waits_for_turn"] is not None:
        head += f", sent after turn {item['waits_for_turn']} is answered"
    return head


def _messages_table(request: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column()
    for m in request["messages"]:
        table.add_row(m["role"], _message_line(m))
    return table
