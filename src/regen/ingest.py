"""Ingest: read every dataset of a job into the store, as conversations and items.

Idempotent: ids derive from content, so re-reading a dataset adds only its new rows, and a
kill in the middle loses nothing.
"""

from __future__ import annotations

import hashlib

from regen.config import DatasetConfig, Job
from regen.conversation import (
    BadRow,
    Conversation,
    canonical_json,
    conversation_id,
    estimate_prompt_tokens,
    stable_hash,
)
from regen.modes import item_id, prompt_hash_of, target_turns
from regen.sources import Source
from regen.sources.readers import HUB_PREFIX
from regen.store import LaneRule, NewConversation, NewItem, Store

INGEST_BATCH = 1000


def order_key(seed: int, iid: str) -> int:
    """Dispatch position: a seeded shuffle, so early results represent the whole dataset."""
    digest = hashlib.blake2b(f"{seed}:{iid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def source_of(job: Job, ds: DatasetConfig) -> Source:
    """The dataset's rows as the job configures them (reader, format, selection, system)."""
    path = ds.path if ds.path.startswith(HUB_PREFIX) else job.resolve(ds.path)
    return Source(
        ds.name,
        path,
        ds.format,
        ds.reader,
        config=ds.config,
        split=ds.split,
        custom=ds.custom.model_dump() if ds.custom else None,
        limit=ds.limit,
        filter=ds.filter,
        sample=ds.sample,
        seed=job.dataset_seed(ds),
        system=ds.system,
        system_prompt=ds.system_prompt,
        leading_assistant=ds.leading_assistant,
        max_row_bytes=ds.max_row_bytes,
    )


def plan_items(
    conv: Conversation, ds: DatasetConfig, seed: int
) -> tuple[NewConversation | None, BadRow | None]:
    """The conversation and its items as the store takes them, and the reason for any turn
    left out (a row with no turn left is only a BadRow)."""
    turns = target_turns(conv, ds.mode)
    if isinstance(turns, str):
        return None, BadRow(ds.name, conv.row_index, turns)
    # Serialize once: the id, prompt hashes and estimates all derive from it.
    data = conv.to_dict()
    text = canonical_json(data)
    if len(text) > ds.max_row_bytes:
        size = f"{len(text) / 2**20:.1f} MiB (max_row_bytes is {ds.max_row_bytes / 2**20:.1f})"
        return None, BadRow(ds.name, conv.row_index, f"conversation is {size}")
    cid = conversation_id(conv.dataset, text)
    items: list[NewItem] = []
    too_long: list[tuple[int, int]] = []
    previous: str | None = None
    for t in turns:
        iid = item_id(cid, t)
        estimate = estimate_prompt_tokens(data, t)
        if ds.max_prompt_tokens is not None and estimate > ds.max_prompt_tokens:
            too_long.append((t, estimate))
            if ds.mode == "sequential":
                break  # later turns would need this one's answer
            continue
        sequential = ds.mode == "sequential"
        items.append(
            NewItem(
                iid,
                t,
                # Sequential prompts hold regenerated turns: no two conversations share one.
                stable_hash(cid, t) if sequential else prompt_hash_of(data, t),
                order_key(seed, iid),
                estimate,
                after_item=previous if sequential else None,
            )
        )
        previous = iid
    bad = None
    if too_long:
        t, est = too_long[0]
        what = "prompt" if len(turns) == 1 else f"{len(too_long)} of {len(turns)} turns' prompts"
        bad = BadRow(
            ds.name,
            conv.row_index,
            f"{what} over max_prompt_tokens ({est} estimated at turn {t}, limit "
            f"{ds.max_prompt_tokens})",
        )
    if not items:
        return None, bad
    return NewConversation(cid, conv.dataset, conv.row_index, text, items), bad


def ingest(store: Store, job: Job) -> None:
    """Read every dataset into the store; new rows add items, known rows change nothing."""
    for position, ds in enumerate(job.datasets):
        source = source_of(job, ds)
        store.register_dataset(ds.name, position, str(source.path))
        seed = job.dataset_seed(ds)
        bad: list[BadRow] = []
        turns_read = 0
        batch: list[NewConversation] = []
        for conv in source:
            if isinstance(conv, BadRow):
                bad.append(conv)
                continue
            new, reason = plan_items(conv, ds, seed)
            if reason is not None:
                bad.append(reason)
            if new is None:
                continue
            turns_read += len(new.items)
            batch.append(new)
            if len(batch) >= INGEST_BATCH:
                store.add_conversations(batch)
                batch = []
        if batch:
            store.add_conversations(batch)
        store.record_source_stats(
            ds.name, source.rows, turns_read, bad, source.skipped, source.format
        )


def lane_rules(job: Job) -> list[LaneRule]:
    return [
        LaneRule(lane.name, lane.datasets, lane.min_prompt_tokens, lane.max_prompt_tokens)
        for lane in job.lane_list
    ]
