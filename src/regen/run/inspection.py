"""`regen inspect`: how a dataset's rows become requests, shown before anything is sent.

Reads the source as the job configures it (reader, format, filter, sample, system policy,
mode, prompt limit) and builds each item's request body as the run would; touches no state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from regen.config import DatasetConfig, Job, LaneConfig
from regen.conversation import BadRow, Conversation, Message
from regen.engine.client.body import chat_body
from regen.errors import ConfigError
from regen.safe import printable
from regen.sources.ingest import plan_items, source_of, target_reasons
from regen.sources.modes import build_request, row_notes

REGENERATED = "<regenerated answer of turn {turn}>"


@dataclass
class ItemView:
    turn_index: int
    prompt_tokens_est: int
    lane: str | None
    body: dict[str, Any]
    waits_for_turn: int | None = None


@dataclass
class RowView:
    row_index: int
    raw: dict[str, Any] | None
    conversation: Conversation | None = None
    reason: str | None = None
    """Why the row (or some of its turns) is not used."""
    items: list[ItemView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the row does not say plainly (modes.row_notes)."""


@dataclass
class Inspection:
    dataset: str
    format: str
    mode: str
    rows: list[RowView]


def _lane(job: Job, ds: str, estimate: int) -> LaneConfig | None:
    for lane in job.lane_list:
        if lane.datasets is not None and ds not in lane.datasets:
            continue
        if lane.min_prompt_tokens is not None and estimate < lane.min_prompt_tokens:
            continue
        if lane.max_prompt_tokens is not None and estimate > lane.max_prompt_tokens:
            continue
        return lane
    return None


def inspect_dataset(job: Job, dataset: str, rows: int = 3, start: int = 0) -> Inspection:
    """The first `rows` rows of a dataset from row number `start` on (after its filter and
    sample), each with the requests it becomes."""
    ds = next((d for d in job.datasets if d.name == dataset), None)
    if ds is None:
        names = ", ".join(d.name for d in job.datasets)
        raise ConfigError(f"no dataset '{dataset}' in the job (datasets: {names})")
    source = source_of(job, ds)
    views: list[RowView] = []
    for raw, conv in source.pairs(start):
        if len(views) >= rows:
            break
        view = RowView(conv.row_index, raw)
        views.append(view)
        if isinstance(conv, BadRow):
            view.reason = conv.reason
            continue
        view.conversation = conv
        new, bad = plan_items(conv, ds, job.dataset_seed(ds), samples=job.dataset_samples(ds))
        view.reason = bad.reason if bad else None
        view.notes = row_notes(conv, target_reasons(job)) if new else []
        for item in new.items if new else []:
            view.items.append(
                _item_view(
                    job,
                    ds,
                    conv,
                    item.turn_index,
                    item.prompt_tokens_est,
                    waits=item.after_item is not None,
                    turns=new.items if new else [],
                    sample=item.sample,
                )
            )
    return Inspection(ds.name, source.format, ds.mode, views)


def _item_view(
    job: Job,
    ds: DatasetConfig,
    conv: Conversation,
    turn: int,
    estimate: int,
    *,
    waits: bool,
    turns: list[Any],
    sample: int = 0,
) -> ItemView:
    regenerated: dict[int, Message] | None = None
    previous = None
    if ds.mode == "sequential":
        earlier = [t.turn_index for t in turns if t.turn_index < turn]
        regenerated = {t: Message("assistant", REGENERATED.format(turn=t)) for t in earlier}
        previous = earlier[-1] if earlier else None
    req = build_request(conv, turn, regenerated=regenerated, sample=sample)
    lane = _lane(job, ds.name, estimate)
    endpoint = job.endpoint_pool[0]
    body = chat_body(
        req,
        job.generation,
        endpoint,
        job.lane_max_tokens(lane) if lane else None,
        stream=bool(lane and lane.stream),
        samples=job.dataset_samples(ds),
    )
    return ItemView(turn, estimate, lane.name if lane else None, body, previous if waits else None)


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


def inspection_view(ins: Inspection) -> Group:
    """The rows and their requests, for a terminal."""
    parts: list[Any] = [
        Text(f"dataset {ins.dataset}: format {ins.format}, mode {ins.mode}", style="bold")
    ]
    if not ins.rows:
        parts.append(Text("no rows (after filter and sample)"))
    for row in ins.rows:
        body: list[Any] = []
        if row.raw is not None:
            fields = ", ".join(f"{k}={_clip(repr(v), 50)}" for k, v in list(row.raw.items())[:8])
            body.append(Text(f"source: {fields}", style="dim"))
        if row.reason:
            body.append(Text(f"not used: {row.reason}", style="red"))
        for note in row.notes:
            body.append(Text(f"note: {note}", style="yellow"))
        for item in row.items:
            head = (
                f"request for turn {item.turn_index}: lane {item.lane or '(none: not sent)'}, "
                f"~{item.prompt_tokens_est} prompt tokens, max_tokens "
                f"{item.body.get('max_tokens')}, {len(item.body.get('tools') or [])} tools"
            )
            if item.waits_for_turn is not None:
                head += f", sent after turn {item.waits_for_turn} is answered"
            table = Table(show_header=False, box=None, pad_edge=False)
            table.add_column(style="cyan", no_wrap=True)
            table.add_column()
            for m in item.body["messages"]:
                table.add_row(m["role"], _message_line(m))
            body += [Text(head, style="bold"), table]
        parts.append(Panel(Group(*body), title=f"row {row.row_index}", title_align="left"))
    return Group(*parts)


def inspection_json(ins: Inspection) -> dict[str, Any]:
    return {
        "dataset": ins.dataset,
        "format": ins.format,
        "mode": ins.mode,
        "rows": [
            {
                "row_index": r.row_index,
                "source": r.raw,
                "reason": r.reason,
                "notes": r.notes,
                "conversation": r.conversation.to_dict() if r.conversation else None,
                "requests": [
                    {
                        "turn_index": i.turn_index,
                        "lane": i.lane,
                        "prompt_tokens_est": i.prompt_tokens_est,
                        "waits_for_turn": i.waits_for_turn,
                        "body": i.body,
                    }
                    for i in r.items
                ],
            }
            for r in ins.rows
        ],
    }
