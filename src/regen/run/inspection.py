"""`regen inspect`: how a dataset's rows become requests, shown before anything is sent.

Reads the source as the job configures it (reader, format, filter, sample, system policy,
mode, prompt limit) and builds each item's request body as the run would; touches no state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from regen.config import DatasetConfig, Job, LaneConfig
from regen.conversation import BadRow, Conversation, Message
from regen.engine.client.body import chat_body
from regen.errors import ConfigError
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


def inspection_json(ins: Inspection) -> dict[str, Any]:
    """The rows and their requests as data: what `--json` prints and view/inspection.py
    draws."""
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
