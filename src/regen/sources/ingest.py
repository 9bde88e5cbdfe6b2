"""Ingest: read every dataset of a job into the store, as conversations and items.

Idempotent: ids derive from content, so re-reading a dataset adds only its new rows, and a
kill in the middle loses nothing. A dataset whose files and settings are those of its last
complete read is not read again: each file's size, modification time and content hash are
recorded with that read (`source_fingerprint`). A complete read also decides the dataset's
view: its items that the source no longer yields (rows removed or changed, turns its settings
no longer select) are not sent, and their answers leave exports (Work.settle_view); a read
cut short leaves the last complete read's view as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import orjson

from regen import __version__, failpoints
from regen.config import DatasetConfig, Job
from regen.conversation import (
    ROLES,
    BadRow,
    Conversation,
    Message,
    canonical_json,
    conversation_id,
    stable_hash,
)
from regen.errors import SourceError
from regen.sources import Source
from regen.sources.modes import item_id, row_notes, sample_prompt_hash, target_turns
from regen.sources.readers import HUB_PREFIX, file_digest, source_files
from regen.state.db import Store
from regen.state.reads import ViewChange
from regen.state.sources import KEPT_BAD_ROWS, KEPT_BAD_ROWS_READ
from regen.state.work import LaneRule, NewConversation, NewItem, first_lane

INGEST_BATCH = 2000
"""Rows planned before they go to the store (which commits far fewer times)."""
READ_VERSION = 2
"""Part of every source fingerprint: bump it when a change to the readers, adapters or
item planning changes what a source yields, so that every dataset is read again once.
2: reads decide which items are in view, so a state made before sees its rows no longer in
the files leave the view on its next run."""


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


_ROLE_TAIL = {role: f',"role":"{role}"}}' for role in ROLES}


def _json_text(obj: Any) -> str:
    """canonical_json through orjson, for values of only strings, None, lists and dicts,
    which orjson writes byte for byte as json.dumps does (floats, which the two write
    differently, live only in `tools`, which stays with json)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # a lone surrogate, which only json writes
        return canonical_json(obj)


def _message_parts(messages: tuple[Message, ...]) -> tuple[list[str], list[int]]:
    """Each message's canonical JSON (as Message.to_dict stores it) and its characters for
    estimate_prompt_tokens (content, reasoning, tool arguments + 16 each), in one pass: a
    plain message is written without building its dict."""
    parts: list[str] = []
    chars: list[int] = []
    for m in messages:
        tail = _ROLE_TAIL.get(m.role)
        if (
            tail is None
            or m.tool_calls
            or m.reasoning is not None
            or m.name is not None
            or m.tool_call_id is not None
        ):
            parts.append(_json_text(m.to_dict()))
            n = len(m.content) + len(m.reasoning or "")
            chars.append(n + sum(len(tc.arguments) + 16 for tc in m.tool_calls))
        else:
            parts.append('{"content":' + _json_text(m.content) + tail)
            chars.append(len(m.content))
    return parts, chars


def _history_json(parts: list[str], turn: int, tools: str) -> str:
    """canonical_json({"messages": messages[:turn], "tools": tools}) from the messages' own
    canonical JSON: each message is serialized once for the row and all its prompts."""
    return '{"messages":[' + ",".join(parts[:turn]) + '],"tools":' + tools + "}"


LaneOf = Callable[[int], str | None]
"""A new item's lane from its estimated prompt tokens (its dataset's lane_of)."""


def no_lane(prompt_tokens_est: int) -> None:
    """No lane: Work.assign_lanes places the item (`regen inspect` stores nothing)."""
    return None


def lane_of(rules: list[LaneRule], dataset: str) -> LaneOf:
    """The lane Work.assign_lanes would give each of a dataset's new items: written with the
    item, so that the first run after a read does not rewrite every item's lane (9-12 s at a
    million items, each a move in items_lane). Most jobs have one lane for a dataset: then
    no rule is asked per item."""
    rules = [r for r in rules if r.datasets is None or dataset in r.datasets]
    first = rules[0] if rules else None
    if first is None or (first.min_prompt_tokens is None and first.max_prompt_tokens is None):
        name = None if first is None else first.name
        return lambda _: name
    return lambda est: first_lane(rules, dataset, est)


def plan_items(
    conv: Conversation,
    ds: DatasetConfig,
    seed: int,
    lane: LaneOf = no_lane,
    samples: int = 1,
    cache_order: bool = True,
) -> tuple[NewConversation | None, BadRow | None]:
    """The conversation and its items as the store takes them, and the reason for any turn
    left out (a row with no turn left is only a BadRow). `cache_order`: a conversation's
    items are placed together in the dispatch order (`[run] cache_order`).

    Ids, prompt hashes and estimates are those of conversation.py and modes.py
    (Conversation.id, prompt_hash_of, estimate_prompt_tokens on Conversation.to_dict()),
    computed from one serialization of each message (tests/sources/test_ingest_speed.py checks them
    against the definitions)."""
    turns = target_turns(conv, ds.mode)
    if isinstance(turns, str):
        return None, BadRow(ds.name, conv.row_index, turns)
    written = _write_conversation(conv, ds)
    if isinstance(written, BadRow):
        return None, written
    items, too_long = _turn_items(conv, ds, written, turns, seed, lane, samples, cache_order)
    bad = _too_long_row(conv, ds, len(turns), too_long) if too_long else None
    if not items:
        return None, bad
    return NewConversation(
        written.cid, conv.dataset, conv.row_index, written.text, items, conv.source_id
    ), bad


class _Written(NamedTuple):
    """A conversation serialized once: its id and text, and each message's canonical JSON
    and characters, with its tools' JSON, from which every turn's prompt is built."""

    cid: str
    text: str
    parts: list[str]
    chars: list[int]
    tools: str


def _write_conversation(conv: Conversation, ds: DatasetConfig) -> _Written | BadRow:
    """The conversation serialized, or the bad row it is (past max_row_bytes, or text with a
    lone surrogate)."""
    parts, chars = _message_parts(conv.messages)
    tools = canonical_json(list(conv.tools)) if conv.tools else "[]"
    text = _history_json(parts, len(parts), tools)
    if len(text) > ds.max_row_bytes:
        size = f"{len(text) / 2**20:.1f} MiB (max_row_bytes is {ds.max_row_bytes / 2**20:.1f})"
        return BadRow(ds.name, conv.row_index, f"conversation is {size}")
    try:
        cid = conversation_id(conv.dataset, text)
    except UnicodeEncodeError:
        # JSON may escape half a surrogate pair ("\\ud800"), which no UTF-8 text can hold.
        return BadRow(ds.name, conv.row_index, "text with a lone surrogate (not Unicode)")
    return _Written(cid, text, parts, chars, tools)


def _turn_items(
    conv: Conversation,
    ds: DatasetConfig,
    w: _Written,
    turns: list[int],
    seed: int,
    lane: LaneOf,
    samples: int,
    cache_order: bool = True,
) -> tuple[list[NewItem], list[tuple[int, int]]]:
    """Each turn's items (one per sample) in turn order, and the turns left out for a prompt
    over max_prompt_tokens, each with its estimate."""
    tool_chars = len(json.dumps(list(conv.tools))) if conv.tools else 0
    kept: list[tuple[int, str, str, int, str | None]] = []
    too_long: list[tuple[int, int]] = []
    sequential = ds.mode == "sequential"
    for t in turns:
        # estimate_prompt_tokens(conv.to_dict(), t)
        estimate = (tool_chars + sum(w.chars[:t])) // 4 + 4 * min(t, len(w.chars)) + 2
        if ds.max_prompt_tokens is not None and estimate > ds.max_prompt_tokens:
            too_long.append((t, estimate))
            if sequential:
                break  # later turns would need this one's answer
            continue
        # Sequential prompts hold regenerated turns: no two conversations share one.
        # Otherwise modes.prompt_hash_of, from the serialized messages.
        key = (
            stable_hash(w.cid, t) if sequential else stable_hash(_history_json(w.parts, t, w.tools))
        )
        kept.append((t, item_id(w.cid, t), key, estimate, lane(estimate)))
    # Sequential turns wait on each other's answers: they keep their own places.
    places = _places(seed, [iid for _, iid, *_ in kept], cache_order and not sequential)
    items: list[NewItem] = []
    previous: str | None = None
    for (t, iid, key, estimate, where), (place, own) in zip(kept, places, strict=True):
        # Each sample its own item, placed right after the first in both orders (keys stay
        # distinct for the keyset reads), so that a prompt's samples go out together.
        for k in range(samples):
            items.append(
                NewItem(
                    iid if k == 0 else item_id(w.cid, t, k),
                    t,
                    sample_prompt_hash(key, k),
                    place + k,
                    estimate,
                    after_item=previous if sequential else None,
                    lane=where,
                    sample=k,
                    pilot_key=own + k,
                )
            )
        previous = iid
    return items, too_long


SAMPLES_STRIDE = 1024
"""Room in the dispatch order after each turn for its samples (`samples` is at most this)."""


def _places(seed: int, iids: list[str], grouped: bool) -> list[tuple[int, int]]:
    """Each turn's dispatch place and its own place in the seeded shuffle (`order_key`, which
    a pilot claims by). Grouped, a conversation's turns follow one another at its first
    turn's place (a one-turn conversation keeps the place it always had), the longest prompt
    first: every earlier turn's prompt is a prefix of it, so once it is computed a provider's
    prefix cache holds them all (issue 50)."""
    own = [order_key(seed, iid) for iid in iids]
    if not grouped or len(iids) < 2:
        return list(zip(own, own, strict=True))
    last = len(iids) - 1
    return [(own[0] + (last - j) * SAMPLES_STRIDE, o) for j, o in enumerate(own)]


def _too_long_row(
    conv: Conversation, ds: DatasetConfig, turns: int, too_long: list[tuple[int, int]]
) -> BadRow:
    """The note for a row's prompts left out over max_prompt_tokens: how many, and the first."""
    t, est = too_long[0]
    what = "prompt" if turns == 1 else f"{len(too_long)} of {turns} turns' prompts"
    return BadRow(
        ds.name,
        conv.row_index,
        f"{what} over max_prompt_tokens ({est} estimated at turn {t}, limit "
        f"{ds.max_prompt_tokens})",
    )


def source_fingerprint(job: Job, ds: DatasetConfig, source: Source) -> str | None:
    """What decides a dataset's rows: its settings and, for each file read, its path, size,
    modification time and content hash. None for a hub id, and for a source that cannot be
    listed (reading it then says why)."""
    try:
        files = source_files(source.path, source.reader, config=source.config, split=source.split)
        if files is None:
            return None
        entries = []
        for f in files:
            st = f.stat()
            entries.append([str(f), st.st_size, st.st_mtime_ns, file_digest(f)])
    except (SourceError, OSError):
        return None
    return canonical_json(
        {
            "read_version": READ_VERSION,
            "regen": __version__,
            # A budget or cap changes what is sent, not what is read.
            "dataset": ds.model_dump(mode="json", exclude={"token_budget", "max_cost_usd"}),
            "seed": job.dataset_seed(ds),
            "files": entries,
            **({"samples": n} if (n := job.dataset_samples(ds)) > 1 else {}),
        }
    )


def _content(fingerprint: str) -> Any:
    """A fingerprint without modification times: a file touched but not changed is the same."""
    fp = json.loads(fingerprint)
    fp["files"] = [[path, size, digest] for path, size, _, digest in fp["files"]]
    return fp


def source_unchanged(stored: str | None, now: str | None) -> bool:
    """Whether a source is as it was at its last complete read (same settings, same files
    with the same sizes and content hashes)."""
    if stored is None or now is None:
        return False
    try:
        return bool(_content(stored) == _content(now))
    except (ValueError, KeyError, TypeError):
        return False  # a fingerprint of another shape: read again


def target_reasons(job: Job) -> bool:
    """Whether the job leaves the target's own reasoning on (its `reasoning` setting does not
    say `enabled = false` or `effort = "none"`)."""
    r = job.generation.reasoning or {}
    return not (r.get("enabled") is False or r.get("effort") == "none")


def read_dataset(
    store: Store,
    ds: DatasetConfig,
    source: Source,
    seed: int,
    lane: LaneOf,
    reasons: bool = True,
    samples: int = 1,
    cache_order: bool = True,
) -> tuple[list[BadRow], list[BadRow], int, int]:
    """Read one dataset into the store (new rows add items, known rows change nothing);
    returns its first bad rows (as many as Sources keeps), the first notes on rows it used
    (modes.row_notes, as BadRows), the turns read and the count of every bad row. Memory
    stays bounded whatever share of the file is bad. Rows read before an error are kept."""
    bad: list[BadRow] = []
    notes: list[BadRow] = []
    failed: list[Exception] = []
    turns_read = 0
    bad_total = 0

    def count_bad(row: BadRow) -> None:
        nonlocal bad_total
        bad_total += 1
        if len(bad) < KEPT_BAD_ROWS_READ:
            bad.append(row)

    def batches() -> Iterator[list[NewConversation]]:
        nonlocal turns_read
        batch: list[NewConversation] = []
        try:
            for conv in source:
                if isinstance(conv, BadRow):
                    count_bad(conv)
                    continue
                new, reason = plan_items(conv, ds, seed, lane, samples, cache_order)
                if reason is not None:
                    count_bad(reason)
                if new is not None and len(notes) < KEPT_BAD_ROWS:
                    notes.extend(
                        BadRow(ds.name, conv.row_index, n) for n in row_notes(conv, reasons)
                    )
                if new is None:
                    continue
                turns_read += len(new.items)
                batch.append(new)
                if len(batch) >= INGEST_BATCH:
                    yield batch
                    batch = []
        except Exception as exc:
            # Raised once what was read is committed, as each batch used to be on its own.
            failed.append(exc)
        if batch:
            yield batch

    store.work.add_conversation_batches(batches())
    if failed:
        raise failed[0]
    return bad, notes, turns_read, bad_total


def ingest(store: Store, job: Job) -> list[str]:
    """Read every dataset into the store; new rows add items, known rows change nothing, and
    items the source no longer yields leave the view. Returns a line per dataset whose rows
    changed since its last complete read, and a note naming the datasets not read again
    because their sources are unchanged."""
    unchanged: list[str] = []
    changes: list[str] = []
    rules = lane_rules(job)
    for position, ds in enumerate(job.datasets):
        source = source_of(job, ds)
        store.sources.register(ds.name, position, str(source.path), ds.mode)
        fingerprint = source_fingerprint(job, ds, source)
        if source_unchanged(store.sources.fingerprint(ds.name), fingerprint):
            unchanged.append(ds.name)
            continue
        read_before = store.sources.read_before(ds.name)
        store.work.start_read(ds.name)
        try:
            bad, notes, turns_read, bad_total = read_dataset(
                store,
                ds,
                source,
                job.dataset_seed(ds),
                lane_of(rules, ds.name),
                target_reasons(job),
                job.dataset_samples(ds),
                job.run.cache_order,
            )
        except BaseException:
            store.work.forget_read()  # not a complete read: the last one's view stands
            raise
        failpoints.reached("read", ds.name)
        # The view before the fingerprint: a kill between them reads the source again.
        change = store.work.settle_view(ds.name)
        if read_before and change:
            changes.append(view_change_line(ds.name, change))
        store.sources.record_read(
            ds.name,
            source.rows,
            turns_read,
            bad,
            source.skipped,
            source.format,
            fingerprint=fingerprint,
            notes=notes,
            bad_total=bad_total,
        )
    if not unchanged:
        return changes
    return changes + [
        f"not read again, their files unchanged since the last read (same sizes and content "
        f"hashes): {', '.join(unchanged)}"
    ]


def view_change_line(dataset: str, c: ViewChange) -> str:
    """What a complete read changed in a dataset since the last one, said before sending."""
    rows = ", ".join(
        f"{n} {what}"
        for n, what in ((c.added, "added"), (c.removed, "removed"), (c.changed, "changed"))
        if n
    )
    parts = [
        f"dataset {dataset}: its source changed since the last read: rows {rows}"
        if rows
        else f"dataset {dataset}: the turns its settings select changed since the last read"
    ]
    what = "rows" if c.removed or c.changed else "turns"
    if c.left_answers:
        parts.append(
            f"{c.left_answers} answers to {what} no longer in it stay in state.db and are left "
            "out of exports (`regen export --keep-orphans` writes them)"
        )
    if c.left_pending:
        parts.append(f"{c.left_pending} items of those {what} not answered yet are not sent")
    if c.back_answers:
        parts.append(f"{c.back_answers} answers kept from before are back in its exports")
    return "; ".join(parts)


def lane_rules(job: Job) -> list[LaneRule]:
    return [
        LaneRule(lane.name, lane.datasets, lane.min_prompt_tokens, lane.max_prompt_tokens)
        for lane in job.lane_list
    ]
