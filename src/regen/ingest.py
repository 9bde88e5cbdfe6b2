"""Ingest: read every dataset of a job into the store, as conversations and items.

Idempotent: ids derive from content, so re-reading a dataset adds only its new rows, and a
kill in the middle loses nothing.
"""

from __future__ import annotations

import hashlib

from regen.config import Job
from regen.conversation import BadRow, canonical_json, conversation_id, estimate_prompt_tokens
from regen.modes import item_id, prompt_hash_of, target_turns
from regen.sources import read_conversations
from regen.store import LaneRule, NewConversation, NewItem, Store

INGEST_BATCH = 1000


def order_key(seed: int, iid: str) -> int:
    """Dispatch position: a seeded shuffle, so early results represent the whole dataset."""
    digest = hashlib.blake2b(f"{seed}:{iid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def ingest(store: Store, job: Job) -> None:
    """Read every dataset into the store; new rows add items, known rows change nothing."""
    for position, ds in enumerate(job.datasets):
        path = job.resolve(ds.path)
        store.register_dataset(ds.name, position, str(path))
        bad: list[BadRow] = []
        rows = turns_read = 0
        batch: list[NewConversation] = []
        for conv in read_conversations(ds.name, path, ds.format, ds.reader, ds.limit):
            rows += 1
            if isinstance(conv, BadRow):
                bad.append(conv)
                continue
            turns = target_turns(conv, ds.mode)
            if isinstance(turns, str):
                bad.append(BadRow(ds.name, conv.row_index, turns))
                continue
            # Serialize once: the id, prompt hashes and estimates all derive from it.
            data = conv.to_dict()
            text = canonical_json(data)
            cid = conversation_id(conv.dataset, text)
            items = []
            for t in turns:
                iid = item_id(cid, t)
                items.append(
                    NewItem(
                        iid,
                        t,
                        prompt_hash_of(data, t),
                        order_key(job.run.shuffle_seed, iid),
                        estimate_prompt_tokens(data, t),
                    )
                )
            turns_read += len(items)
            batch.append(NewConversation(cid, conv.dataset, conv.row_index, text, items))
            if len(batch) >= INGEST_BATCH:
                store.add_conversations(batch)
                batch = []
        if batch:
            store.add_conversations(batch)
        store.record_source_stats(ds.name, rows, turns_read, bad)


def lane_rules(job: Job) -> list[LaneRule]:
    return [
        LaneRule(lane.name, lane.datasets, lane.min_prompt_tokens, lane.max_prompt_tokens)
        for lane in job.lane_list
    ]
