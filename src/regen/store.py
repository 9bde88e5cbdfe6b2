"""state.db: the schema, its migrations, and every read and write of a job's state.

Nobody else opens state.db. Writes that belong together (a result, its attempts and its ledger
charge) happen in one transaction, so a crash at any moment leaves either all of them or none.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import itemgetter
from pathlib import Path
from typing import Any, overload

from regen.conversation import (
    BadRow,
    Charge,
    Message,
    Outcome,
    ToolCall,
    estimate_prompt_tokens,
)
from regen.errors import StateError, StateGone
from regen.outstanding import Outstanding, m009_outstanding

STATE_FILE = "state.db"


def _script(db: sqlite3.Connection, sql: str) -> None:
    # executescript() would COMMIT the migration's transaction half-way: run statements one by one.
    for statement in sql.split(";"):
        if statement.strip():
            db.execute(statement)


def m001_initial(db: sqlite3.Connection) -> None:
    _script(
        db,
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE datasets (
            name TEXT PRIMARY KEY,
            position INTEGER NOT NULL,
            source TEXT NOT NULL,
            rows_read INTEGER NOT NULL DEFAULT 0,
            bad_rows INTEGER NOT NULL DEFAULT 0,
            turns_read INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE bad_rows (
            dataset TEXT NOT NULL,
            row_index INTEGER NOT NULL,
            reason TEXT NOT NULL,
            PRIMARY KEY (dataset, row_index)
        );
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            dataset TEXT NOT NULL,
            row_index INTEGER NOT NULL,
            data TEXT NOT NULL
        );
        CREATE TABLE items (
            id TEXT PRIMARY KEY,
            dataset TEXT NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            turn_index INTEGER NOT NULL,
            prompt_hash TEXT NOT NULL,
            order_key INTEGER NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'done', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            failure_class TEXT,
            failure_message TEXT,
            updated_at REAL
        );
        CREATE INDEX items_dispatch ON items (dataset, status, order_key);
        -- Identical prompts within a dataset are sent once: the first row that has it wins.
        CREATE UNIQUE INDEX items_prompt ON items (dataset, prompt_hash);
        CREATE TABLE results (
            item_id TEXT PRIMARY KEY REFERENCES items(id),
            dataset TEXT NOT NULL,
            content TEXT NOT NULL,
            reasoning TEXT,
            tool_calls TEXT,
            finish_reason TEXT,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            reasoning_tokens INTEGER NOT NULL,
            cost_usd REAL,
            provider TEXT,
            model TEXT,
            generation_id TEXT,
            latency_s REAL NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX results_dataset ON results (dataset);
        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL REFERENCES items(id),
            number INTEGER NOT NULL,
            started_at REAL NOT NULL,
            latency_s REAL NOT NULL,
            status INTEGER,
            failure_class TEXT,
            message TEXT,
            provider TEXT,
            generation_id TEXT
        );
        CREATE INDEX attempts_item ON attempts (item_id);
        CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL REFERENCES items(id),
            dataset TEXT NOT NULL,
            kind TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            cost_usd REAL,
            created_at REAL NOT NULL
        );
        CREATE INDEX ledger_dataset ON ledger (dataset);
        """,
    )


def m002_lanes(db: sqlite3.Connection) -> None:
    """Lanes: each pending item is assigned to a lane at the start of a run; an estimate of its
    prompt tokens lets lanes select by size; escalated items keep the lane they moved to."""
    _script(
        db,
        """
        ALTER TABLE items ADD COLUMN lane TEXT;
        ALTER TABLE items ADD COLUMN prompt_tokens_est INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE items ADD COLUMN escalated INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX items_lane ON items (lane, dataset, status, escalated, order_key)
        """,
    )
    rows = db.execute(
        "SELECT i.id, i.turn_index, c.data FROM items i "
        "JOIN conversations c ON c.id = i.conversation_id"
    ).fetchall()
    db.executemany(
        "UPDATE items SET prompt_tokens_est = ? WHERE id = ?",
        [(estimate_prompt_tokens(json.loads(data), turn), iid) for iid, turn, data in rows],
    )


def m003_ledger_sources(db: sqlite3.Connection) -> None:
    """Each charge names the endpoint that made it, the provider that served it and its
    generation id, so that the ledger can be reconciled with an account's usage. Charges made
    before keep a null endpoint; their provider and generation id come from their results."""
    _script(
        db,
        """
        ALTER TABLE ledger ADD COLUMN endpoint TEXT;
        ALTER TABLE ledger ADD COLUMN provider TEXT;
        ALTER TABLE ledger ADD COLUMN generation_id TEXT;
        UPDATE ledger SET
            provider = (SELECT r.provider FROM results r WHERE r.item_id = ledger.item_id),
            generation_id = (SELECT r.generation_id FROM results r WHERE r.item_id = ledger.item_id)
        WHERE kind = 'completion'
        """,
    )


def m004_sources(db: sqlite3.Connection) -> None:
    """Sources: the format a dataset was read as (the detected one for `auto`) and the rows
    its filter or sample left out; in sequential mode an item waits for the item of the
    conversation's previous turn (`after_item`) to be done."""
    _script(
        db,
        """
        ALTER TABLE datasets ADD COLUMN format TEXT;
        ALTER TABLE datasets ADD COLUMN skipped_rows INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE items ADD COLUMN after_item TEXT;
        CREATE INDEX items_after ON items (after_item) WHERE after_item IS NOT NULL
        """,
    )


def m005_token_ids(db: sqlite3.Connection) -> None:
    """Exact token ids of prompt and answer, from servers that return them (vLLM, SGLang):
    little-endian uint32 arrays (pack_ids), NULL where the server gave none."""
    _script(
        db,
        """
        ALTER TABLE results ADD COLUMN prompt_token_ids BLOB;
        ALTER TABLE results ADD COLUMN completion_token_ids BLOB
        """,
    )


def m006_usage_source(db: sqlite3.Connection) -> None:
    """Where an answer's token counts come from when the server sent no usage: `ids` (counted
    from its token ids) or `estimate` (from the text); NULL: the server's usage."""
    _script(db, "ALTER TABLE results ADD COLUMN usage_source TEXT")


def m007_runs(db: sqlite3.Connection) -> None:
    """Runs and their timeline: when each run (or pilot) started and ended, with the job's
    dollar cap and the lanes' settings then; about once a second, each lane's requests on the
    wire and adaptive limit; and the lane each attempt went out on and each charge was made
    in. The report draws a job's history from these, and `regen plan` measures each lane from
    them, with the limit a provider let the lane settle at."""
    _script(
        db,
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('run', 'pilot')),
            started_at REAL NOT NULL,
            ended_at REAL,
            stop_reason TEXT,
            max_cost_usd REAL,
            lanes TEXT NOT NULL
        );
        CREATE TABLE timeline (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            t REAL NOT NULL,
            lane TEXT NOT NULL,
            in_flight INTEGER NOT NULL,
            limit_now INTEGER NOT NULL,
            concurrency INTEGER NOT NULL
        );
        CREATE INDEX timeline_run ON timeline (run_id, t);
        ALTER TABLE attempts ADD COLUMN lane TEXT;
        ALTER TABLE ledger ADD COLUMN lane TEXT
        """,
    )


def m008_startup_indexes(db: sqlite3.Connection) -> None:
    """What a run reads before its first request comes from indexes alone. items_lane ends
    with the prompt-token estimate: summing the pending items' estimates per (lane, dataset)
    read each item from the table, 2.5 s at a million items. Failed items, and pending items
    escalated to a lane, have partial indexes of their own: re-queueing transient failures and
    returning escalated items of a lane gone from the job read every item. The ledger's
    answers per lane and totals per dataset are read from indexes a third of its rows' size
    (0.24 and 0.1 s a run at half a million charges, against 0.06 each)."""
    # As DEFERRED_INDEXES has it, to the letter: a read into an empty table drops and builds it.
    db.execute("DROP INDEX IF EXISTS items_lane")
    db.execute(
        "CREATE INDEX items_lane ON items "
        "(lane, dataset, status, escalated, order_key, prompt_tokens_est)"
    )
    _script(
        db,
        """
        CREATE INDEX items_failed ON items (failure_class) WHERE status = 'failed';
        CREATE INDEX items_escalated ON items (lane) WHERE status = 'pending' AND escalated = 1;
        DROP INDEX ledger_dataset;
        CREATE INDEX ledger_dataset ON ledger
            (dataset, prompt_tokens, completion_tokens, cost_usd);
        CREATE INDEX ledger_lane ON ledger (lane, dataset, kind)
        """,
    )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    m001_initial,
    m002_lanes,
    m003_ledger_sources,
    m004_sources,
    m005_token_ids,
    m006_usage_source,
    m007_runs,
    m008_startup_indexes,
    m009_outstanding,
]


DEFERRED_INDEXES = {
    "items_dispatch": "CREATE INDEX IF NOT EXISTS items_dispatch ON items "
    "(dataset, status, order_key)",
    "items_lane": "CREATE INDEX IF NOT EXISTS items_lane ON items "
    "(lane, dataset, status, escalated, order_key, prompt_tokens_est)",
}
"""Indexes on items that a first read into an empty table builds after its rows are in
(Store.add_conversation_batches): their keys are random, and inserting a million of them
one by one took 5 s more than sorting them once. They are dropped in the same transaction
that records so in meta (DEFERRED_META), and Store.open builds them while it is there: a kill
in between leaves nothing the next run does not mend. The other indexes stay: the unique
ones decide which rows are new."""
DEFERRED_META = "deferred_indexes"


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@overload
def pack_ids(ids: Sequence[int]) -> bytes: ...
@overload
def pack_ids(ids: None) -> None: ...
def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    """Token ids as little-endian uint32 bytes (4 bytes an id, a tenth of their JSON)."""
    if ids is None:
        return None
    arr = array.array("I", ids)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    arr = array.array("I")
    arr.frombytes(blob)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


@dataclass(slots=True)
class BadRowGroup:
    """Bad rows of a dataset with the same reason (up to its numbers)."""

    dataset: str
    source: str
    example: str
    """The reason of the group's first row, numbers and all."""
    rows: int
    first_rows: list[int]
    """Row numbers, counted from 0 in the source (over its files in name order)."""


@dataclass(frozen=True, slots=True)
class DatasetProgress:
    """Counts and totals for one dataset, all read from state.db."""

    name: str
    position: int
    rows_read: int
    bad_rows: int
    turns_read: int
    items: int
    done: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float

    @property
    def pending(self) -> int:
        return self.items - self.done - self.failed

    @property
    def duplicates(self) -> int:
        """Turns of the last read whose prompt an earlier row already had."""
        return max(0, self.turns_read - self.items)


@dataclass(frozen=True, slots=True)
class DatasetSample:
    """What a dataset's answers so far say about the rest: prompt-size estimates of the done
    and pending items, and the done answers' total latency."""

    name: str
    pending: int
    pending_prompt_est: int
    done_prompt_est: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert: its id, turn, prompt hash (for dedup) and dispatch position."""

    id: str
    turn_index: int
    prompt_hash: str
    order_key: int
    prompt_tokens_est: int = 0
    after_item: str | None = None
    """Sequential mode: the item of the previous turn, which must be done first."""
    lane: str | None = None
    """The lane that takes it (first_lane), as Store.assign_lanes would give it."""


@dataclass(frozen=True, slots=True)
class NewConversation:
    """A source row to insert: its id, the normalized conversation as JSON, and its items."""

    id: str
    dataset: str
    row_index: int
    data: str
    items: list[NewItem]


@dataclass(frozen=True, slots=True)
class LaneRule:
    """Which pending items a lane takes: by dataset and estimated prompt tokens."""

    name: str
    datasets: list[str] | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None

    def selects(self, dataset: str, prompt_tokens_est: int) -> bool:
        """Whether the rule takes an item (what Store.assign_lanes asks in SQL)."""
        return (
            (self.datasets is None or dataset in self.datasets)
            and (self.min_prompt_tokens is None or prompt_tokens_est >= self.min_prompt_tokens)
            and (self.max_prompt_tokens is None or prompt_tokens_est <= self.max_prompt_tokens)
        )


def first_lane(rules: Sequence[LaneRule], dataset: str, prompt_tokens_est: int) -> str | None:
    """The lane of a new item: the first rule that selects it (None: no lane does)."""
    for rule in rules:
        if rule.selects(dataset, prompt_tokens_est):
            return rule.name
    return None


@dataclass(frozen=True, slots=True)
class PendingItem:
    """An item to send, with the conversation it comes from."""

    id: str
    dataset: str
    turn_index: int
    order_key: int
    conversation: dict[str, Any]
    row_index: int
    conversation_id: str
    prompt_tokens_est: int = 0
    after_item: str | None = None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run (or pilot) of the job: when it started and ended (None: it was killed; the
    last timeline point stands in), why it stopped, the job's dollar cap and its lanes then
    ({lane: {"max_tokens": N, "concurrency": N, "escalate_to": name or None}})."""

    id: int
    kind: str
    started_at: float
    ended_at: float | None
    stop_reason: str | None
    max_cost_usd: float | None
    lanes: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One lane at one moment of a run: requests on the wire and the adaptive limit."""

    run_id: int
    t: float
    lane: str
    in_flight: int
    limit: int
    concurrency: int


@dataclass(frozen=True, slots=True)
class AttemptFact:
    """One attempt, as the report and the plan read it (lane None: made before lanes were
    recorded)."""

    started_at: float
    latency_s: float
    status: int | None
    failure_class: str | None
    dataset: str
    lane: str | None


@dataclass(frozen=True, slots=True)
class LaneCapacity:
    """What a lane's provider let it keep on the wire: requests refused for capacity (429s)
    in all runs, the most answered at once, and the latest run's mean requests on the wire
    over its middle 80% (None: no finished run)."""

    refused: int
    most_answered: int
    run_in_flight: float | None
    run_samples: int


@dataclass(frozen=True, slots=True)
class FlowEntry:
    """One finished passage of an item through a lane, as `regen plan` measures lanes."""

    lane: str | None
    dataset: str
    outcome: str
    """`done`, `failed`, or `escalated` (its truncated answer went on to a longer lane)."""
    prompt_tokens_est: int
    attempts: int
    ok: int
    """Attempts that were answered."""
    wire_s: float
    """Time on the wire, over all its attempts there."""
    span_s: float
    """From its first attempt's start to its last one's end: wire time, back-offs and waits
    for a slot between attempts."""
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    """Everything charged for it there: its answer and any billed failed attempt."""


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt, as `regen status` lists it."""

    started_at: float
    dataset: str
    item_id: str
    failure_class: str
    status: int | None
    message: str | None


_EXPORT_COLUMNS = (
    "r.item_id, i.turn_index, c.data, r.content, r.reasoning, r.tool_calls, r.finish_reason, "
    "i.after_item, c.id, r.provider, r.prompt_tokens, r.completion_tokens, r.cost_usd, "
    "r.created_at, r.prompt_token_ids, r.completion_token_ids"
)
"""What an ExportRow is read from (results r, items i, conversations c)."""


@dataclass(frozen=True, slots=True)
class ExportRow:
    """A done item with its conversation, as export needs it."""

    item_id: str
    turn_index: int
    conversation: dict[str, Any]
    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    regenerated: dict[int, dict[str, Any]] | None = None
    """Sequential mode: the regenerated earlier turns (by turn index), as messages."""
    conversation_id: str = ""
    provider: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    created_at: float = 0.0
    prompt_token_ids: bytes | None = None
    completion_token_ids: bytes | None = None
    """Exact ids as stored (store.unpack_ids), when the server returned them."""

    def history(self) -> list[dict[str, Any]]:
        """The messages the request sent: the turns before this one, with sequential mode's
        regenerated answers in place of the original ones."""
        history: list[dict[str, Any]] = self.conversation["messages"][: self.turn_index]
        if self.regenerated:
            history = [self.regenerated.get(i, m) for i, m in enumerate(history)]
        return history


def _hint(exc: sqlite3.Error) -> str:
    """What a storage error most likely means, in the user's terms."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name == "SQLITE_FULL":
        return " (the disk is full)"
    if name.startswith("SQLITE_IOERR"):
        return " (the disk may be full, or the file too large for its limits)"
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return " (the output directory or state.db is read-only)"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return (
            " (the file is damaged: restore it from a backup, or try `sqlite3 state.db "
            '".recover"`; regen will not start over in this directory)'
        )
    return ""


PAST_JOB_SIGNS = ("run.log", "export", "report.html")
"""What a directory that held a job keeps beside its state.db."""


def refuse_lost_state(out_dir: Path) -> None:
    """An output directory with signs of a past job but no usable state.db is not a new job:
    starting over would pay for every item again and replace its exports."""
    path = out_dir / STATE_FILE
    signs = [name for name in PAST_JOB_SIGNS if (out_dir / name).exists()]
    if not signs:
        return
    if not path.exists():
        state = "missing"
    elif path.stat().st_size == 0:
        state = "empty (0 bytes)"
    else:
        return
    raise StateError(
        f"{out_dir}: holds a past job ({', '.join(signs)}) but its {STATE_FILE} is {state}; "
        "regen will not start it over (that would pay for every item again and replace the "
        "exports): restore state.db from a backup, or give a new output directory"
    )


_PENDING_COLUMNS = (
    "i.id, i.dataset, i.turn_index, i.order_key, c.data, c.row_index, c.id, i.prompt_tokens_est, "
    "i.after_item FROM items i JOIN conversations c ON c.id = i.conversation_id"
)


INGEST_COMMIT_ROWS = 250_000
"""Rows per transaction while a source is read (Store.add_conversation_batches)."""
INGEST_SORT_ROWS = 50_000
"""Rows inserted at once in key order while a source is read (a commit holds several)."""
INGEST_CACHE_KIB = 512 * 1024
"""SQLite's page cache while a source is read: about the indexes of 2M items."""


Rows = list[tuple[Any, ...]]


def _add_rows(batch: Iterable[NewConversation], conv_rows: Rows, item_rows: Rows) -> None:
    """The conversations' and their items' table rows, appended in the source's order."""
    for conv in batch:
        cid = conv.id
        conv_rows.append((cid, conv.dataset, conv.row_index, conv.data))
        item_rows.extend(
            (
                it.id,
                conv.dataset,
                cid,
                it.turn_index,
                it.prompt_hash,
                it.order_key,
                it.prompt_tokens_est,
                it.after_item,
                it.lane,
            )
            for it in conv.items
        )


def _insert_sorted(db: sqlite3.Connection, conv_rows: Rows, item_rows: Rows) -> int:
    """_insert_rows with conversations in id order and items in prompt-hash order. The sorts
    are stable: of two rows with the same key, the earlier still goes in first, and wins."""
    conv_rows.sort(key=itemgetter(0))
    item_rows.sort(key=itemgetter(4))
    return _insert_rows(db, conv_rows, item_rows)


def _insert_rows(db: sqlite3.Connection, conv_rows: Rows, item_rows: Rows) -> int:
    """Insert conversations and items (_add_rows) in the open transaction; return the new
    items. Where two rows have the same id, or two items the same prompt, the earlier wins."""
    db.executemany("INSERT OR IGNORE INTO conversations VALUES (?, ?, ?, ?)", conv_rows)
    mid = db.total_changes
    db.executemany(
        "INSERT OR IGNORE INTO items (id, dataset, conversation_id, turn_index, "
        "prompt_hash, order_key, prompt_tokens_est, after_item, lane) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        item_rows,
    )
    return db.total_changes - mid


def _pending(r: tuple[Any, ...]) -> PendingItem:
    return PendingItem(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8])


class Store:
    """A job's state.db. Open with Store.open(out_dir)."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._identity = _identity(path)
        """The file opened (device, inode): each write checks it is still the one there."""
        self.outstanding = Outstanding(db, self._tx)
        """Requests sent whose bill is not in the ledger yet."""

    @classmethod
    def open(cls, out_dir: Path) -> Store:
        """Open (creating if needed) `<out_dir>/state.db` and apply pending migrations."""
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"{out_dir}: cannot create output directory: {exc}") from exc
        refuse_lost_state(out_dir)
        path = out_dir / STATE_FILE
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA busy_timeout=10000")
            store = cls(db, path)
            store._migrate()
            store._build_deferred_indexes()
        except sqlite3.Error as exc:
            raise StateError(f"{path}: cannot open state database: {exc}{_hint(exc)}") from exc
        return store

    @classmethod
    def open_readonly(cls, out_dir: Path) -> Store:
        """Open `<out_dir>/state.db` for reading only, as `regen status` does while a run may
        be writing it (WAL lets readers and the writer work at once). Nothing is migrated."""
        path = out_dir / STATE_FILE
        if not path.is_file():
            raise StateError(f"{out_dir}: no {STATE_FILE} here: not a regen output directory")
        try:
            try:
                store = cls._connect_readonly(path, immutable=False)
            except sqlite3.OperationalError:
                if os.access(out_dir, os.W_OK):
                    raise
                # A read-only directory: SQLite cannot make the shared-memory file a WAL
                # reader needs. No run can be writing here, so the file is read as it is.
                wal = path.with_name(path.name + "-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise StateError(
                        f"{path}: the directory is read-only and {wal.name} holds changes "
                        "not yet in state.db, which a read-only reader cannot apply: copy the "
                        "directory (with that file) somewhere writable and read the copy"
                    ) from None
                store = cls._connect_readonly(path, immutable=True)
            newest = store.schema_version()
        except sqlite3.Error as exc:
            raise StateError(f"{path}: cannot read state database: {exc}{_hint(exc)}") from exc
        if newest > len(MIGRATIONS):
            raise StateError(f"{path}: made by a newer regen (schema {newest}); upgrade regen")
        return store

    @classmethod
    def _connect_readonly(cls, path: Path, *, immutable: bool) -> Store:
        uri = f"file:{path}?mode=ro" + ("&immutable=1" if immutable else "")
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout=10000")
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.Error:
            db.close()
            raise
        return cls(db, path)

    def close(self) -> None:
        self._db.close()

    def check_in_place(self) -> None:
        """Raise if state.db was deleted, moved or replaced since it was opened: a connection
        to a deleted file writes on into nothing, and the next run would pay for it all."""
        if _identity(self.path) != self._identity:
            raise StateGone(
                f"{self.path} was deleted or replaced while this run was using it; stopping "
                "at once (answers since then are lost with it). Restore the directory, or "
                "start again in a new one"
            )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self.check_in_place()
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (a full disk) leaves the transaction open: end it, so that
                # the next write can try again.
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: write failed: {exc}{_hint(exc)}") from exc

    def _migrate(self) -> None:
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        done = {v for (v,) in self._db.execute("SELECT version FROM schema_migrations")}
        for version, migration in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            with self._tx() as db:
                migration(db)
                db.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (version, migration.__name__, time.time()),
                )

    def schema_version(self) -> int:
        (v,) = self._db.execute(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations"
        ).fetchone()
        return int(v)

    # meta

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def ledger_usd(self, endpoints: Iterable[str]) -> float:
        """What the ledger charged to these endpoints, in USD."""
        names = list(endpoints)
        (total,) = self._db.execute(
            "SELECT COALESCE(SUM(cost_usd), 0.0) FROM ledger "
            f"WHERE endpoint IN ({','.join('?' * len(names))})",
            names,
        ).fetchone()
        return float(total)

    # ingest

    def register_dataset(self, name: str, position: int, source: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO datasets (name, position, source) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
                "source = excluded.source",
                (name, position, source),
            )

    def add_conversations(self, batch: Iterable[NewConversation]) -> int:
        """Insert conversations and their items; return how many items are new.

        Existing ids and already-seen prompts are left as they are, so re-reading a source only
        adds what is new.
        """
        conv_rows: Rows = []
        item_rows: Rows = []
        _add_rows(batch, conv_rows, item_rows)
        with self._tx() as db:
            return _insert_rows(db, conv_rows, item_rows)

    def add_conversation_batches(
        self,
        batches: Iterable[Iterable[NewConversation]],
        commit_rows: int = INGEST_COMMIT_ROWS,
        sort_rows: int = INGEST_SORT_ROWS,
    ) -> int:
        """add_conversations for a whole source, committed every `commit_rows` rows; returns
        how many items are new.

        A source's rows land at random places in five indexes (ids, prompt hashes, dispatch
        order), and each commit writes every index page it touched: a commit per 1,000 rows
        with SQLite's default 2 MB cache made ingest slower per row the larger the dataset.
        So: few commits, and a page cache that holds the indexes while the source is read
        (given back afterwards). Foreign keys are not checked meanwhile: each item's
        conversation is inserted just before it. Into an empty table, the DEFERRED_INDEXES
        are built once the rows are in. Rows go in `sort_rows` at a time in key order
        (_insert_sorted), so that each index page takes its keys together.
        """
        db = self._db
        (cache,) = db.execute("PRAGMA cache_size").fetchone()
        db.execute(f"PRAGMA cache_size = {-INGEST_CACHE_KIB}")
        db.execute("PRAGMA foreign_keys = OFF")
        added = 0
        deferred: bool | None = None
        try:
            pending = iter(batches)
            more = True
            while more:
                more = False
                with self._tx() as tx:
                    if deferred is None:
                        deferred = tx.execute("SELECT 1 FROM items LIMIT 1").fetchone() is None
                        if deferred:
                            for name in DEFERRED_INDEXES:
                                tx.execute(f"DROP INDEX IF EXISTS {name}")
                            tx.execute(
                                "INSERT OR REPLACE INTO meta VALUES (?, '1')", [DEFERRED_META]
                            )
                    rows = 0
                    conv_rows: Rows = []
                    item_rows: Rows = []
                    for batch in pending:
                        _add_rows(batch, conv_rows, item_rows)
                        if len(conv_rows) >= sort_rows:
                            added += _insert_sorted(tx, conv_rows, item_rows)
                            rows += len(conv_rows)
                            conv_rows, item_rows = [], []
                        if rows >= commit_rows:
                            more = True
                            break
                    added += _insert_sorted(tx, conv_rows, item_rows)
            if deferred:
                self._build_deferred_indexes()
        except BaseException:
            if deferred:
                # Best effort: what is not built now, the next Store.open builds.
                with contextlib.suppress(StateError):
                    self._build_deferred_indexes()
            raise
        finally:
            db.execute("PRAGMA foreign_keys = ON")
            db.execute(f"PRAGMA cache_size = {int(cache)}")
        return added

    def _build_deferred_indexes(self) -> None:
        """Build the DEFERRED_INDEXES if a read dropped them (a write only then)."""
        if self.get_meta(DEFERRED_META) is None:
            return
        with self._tx() as tx:
            for sql in DEFERRED_INDEXES.values():
                tx.execute(sql)
            tx.execute("DELETE FROM meta WHERE key = ?", (DEFERRED_META,))

    def source_fingerprint(self, dataset: str) -> str | None:
        """The fingerprint recorded with the dataset's last complete read (record_source_stats)."""
        return self.get_meta(f"source_fingerprint {dataset}")

    def record_source_stats(
        self,
        dataset: str,
        rows_read: int,
        turns_read: int,
        bad: list[BadRow],
        skipped: int = 0,
        fmt: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Replace the dataset's bad-row report with this read's, and record the source's
        fingerprint (None: none is known, so the next run reads the source again)."""
        with self._tx() as db:
            db.execute("DELETE FROM bad_rows WHERE dataset = ?", (dataset,))
            db.executemany(
                "INSERT OR REPLACE INTO bad_rows VALUES (?, ?, ?)",
                [(b.dataset, b.row_index, b.reason) for b in bad],
            )
            db.execute(
                "UPDATE datasets SET rows_read = ?, turns_read = ?, bad_rows = ?, "
                "skipped_rows = ?, format = COALESCE(?, format) WHERE name = ?",
                (rows_read, turns_read, len(bad), skipped, fmt, dataset),
            )
            key = f"source_fingerprint {dataset}"
            if fingerprint is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, fingerprint))

    def dataset_source(self, dataset: str) -> str:
        row = self._db.execute("SELECT source FROM datasets WHERE name = ?", (dataset,)).fetchone()
        return str(row[0]) if row else "?"

    def bad_rows(self, dataset: str | None = None, limit: int = 10) -> list[BadRow]:
        """The first bad rows (of a dataset, or of all), in row order."""
        where, args = ("WHERE dataset = ? ", (dataset,)) if dataset else ("", ())
        rows = self._db.execute(
            f"SELECT b.dataset, b.row_index, b.reason FROM bad_rows b {where}"
            "ORDER BY (SELECT position FROM datasets d WHERE d.name = b.dataset), row_index "
            "LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [BadRow(*r) for r in rows]

    def bad_row_reasons(self, limit: int = 5) -> list[BadRowGroup]:
        """The commonest bad-row reasons per dataset: rows whose reasons differ only in their
        numbers are one group, shown by its first row's own reason and its first rows."""
        groups: dict[tuple[str, str], BadRowGroup] = {}
        for ds, row, reason, source in self._db.execute(
            "SELECT b.dataset, b.row_index, b.reason, d.source FROM bad_rows b "
            "LEFT JOIN datasets d ON d.name = b.dataset ORDER BY b.dataset, b.row_index"
        ):
            key = (ds, re.sub(r"\d+", "N", reason))
            g = groups.get(key)
            if g is None:
                g = groups[key] = BadRowGroup(ds, source or "?", reason[:200], 0, [])
            g.rows += 1
            if len(g.first_rows) < 5:
                g.first_rows.append(row)
        return sorted(groups.values(), key=lambda g: -g.rows)[:limit]

    # dispatch

    def requeue_retryable_failures(self, retryable: Iterable[str]) -> int:
        """Give items that failed for a transient reason in an earlier run another chance."""
        classes = sorted(retryable)
        marks = ",".join("?" * len(classes))
        with self._tx() as db:
            cur = db.execute(
                "UPDATE items SET status = 'pending', failure_class = NULL, failure_message = NULL"
                f" WHERE status = 'failed' AND failure_class IN ({marks})",
                classes,
            )
            return cur.rowcount

    def assign_lanes(self, rules: list[LaneRule]) -> dict[str, int]:
        """Give every pending item the first lane whose rule selects it; items escalated to a
        lane that still exists keep it. Returns the pending items no lane selects (they are
        not sent), by dataset."""
        names = [r.name for r in rules]
        marks = ",".join("?" * len(names))
        whens: list[str] = []
        args: list[Any] = []
        for rule in rules:
            where: list[str] = []
            if rule.datasets is not None:
                where.append(f"dataset IN ({','.join('?' * len(rule.datasets))})")
                args.extend(rule.datasets)
            if rule.min_prompt_tokens is not None:
                where.append("prompt_tokens_est >= ?")
                args.append(rule.min_prompt_tokens)
            if rule.max_prompt_tokens is not None:
                where.append("prompt_tokens_est <= ?")
                args.append(rule.max_prompt_tokens)
            whens.append(f"WHEN {' AND '.join(where) or '1'} THEN ?")
            args.append(rule.name)
        # The first rule that selects an item names its lane. Only items whose lane changes
        # are written: each write moves the item in items_lane, and rewriting a million
        # unchanged lanes took 17-23 s of every restart.
        lane = f"CASE {' '.join(whens)} ELSE NULL END" if whens else "NULL"
        with self._tx() as db:
            db.execute(
                "UPDATE items SET escalated = 0 WHERE status = 'pending' AND escalated = 1 "
                f"AND lane NOT IN ({marks})",
                names,
            )
            db.execute(
                f"UPDATE items SET lane = {lane} WHERE status = 'pending' "
                f"AND (escalated = 0 OR lane IS NULL) AND lane IS NOT ({lane})",
                [*args, *args],
            )
            rows = db.execute(
                "SELECT dataset, COUNT(*) FROM items WHERE lane IS NULL AND status = 'pending' "
                "GROUP BY dataset"
            ).fetchall()
        return {ds: n for ds, n in rows}

    def claim_batch(
        self, dataset: str, after_key: int, limit: int, lane: str | None = None
    ) -> list[PendingItem]:
        """The next pending items of a dataset (in a lane) in dispatch order (keyset on
        order_key). Escalated items are claimed separately."""
        lane_sql = "AND i.lane = ? AND i.escalated = 0 " if lane is not None else ""
        args: tuple[Any, ...] = (dataset, after_key, *((lane,) if lane else ()), limit)
        # An item of a sequential conversation waits until its previous turn is done.
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} "
            "WHERE i.dataset = ? AND i.status = 'pending' AND i.order_key > ? "
            "AND (i.after_item IS NULL OR "
            "(SELECT p.status FROM items p WHERE p.id = i.after_item) = 'done') "
            f"{lane_sql}ORDER BY i.order_key LIMIT ?",
            args,
        ).fetchall()
        return [_pending(r) for r in rows]

    def blocked_items(self) -> dict[str, int]:
        """Pending turns of sequential conversations whose earlier turn failed, per dataset."""
        rows = self._db.execute(
            "WITH RECURSIVE blocked(id, dataset) AS ("
            " SELECT i.id, i.dataset FROM items i JOIN items p ON p.id = i.after_item"
            " WHERE i.status = 'pending' AND p.status = 'failed'"
            " UNION SELECT i.id, i.dataset FROM items i JOIN blocked b ON i.after_item = b.id"
            " WHERE i.status = 'pending')"
            " SELECT dataset, COUNT(*) FROM blocked GROUP BY dataset"
        ).fetchall()
        return {ds: n for ds, n in rows}

    def claim_escalated(
        self, lane: str, limit: int, after: tuple[int, str] | None = None
    ) -> list[PendingItem]:
        """Pending items escalated to a lane, in dispatch order, after `(order_key, id)`
        (keyset: the first page is mostly items already in flight on a wide lane)."""
        key, item = after if after is not None else (-1, "")
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} "
            "WHERE i.lane = ? AND i.escalated = 1 AND i.status = 'pending' "
            "AND (i.order_key, i.id) > (?, ?) ORDER BY i.order_key, i.id LIMIT ?",
            (lane, key, item, limit),
        ).fetchall()
        return [_pending(r) for r in rows]

    def is_pending(self, item_id: str) -> bool:
        row = self._db.execute("SELECT status FROM items WHERE id = ?", (item_id,)).fetchone()
        return row is not None and row[0] == "pending"

    def escalated_pending(self, dataset: str) -> int:
        """Items of a dataset escalated to another lane and not finished yet."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM items WHERE dataset = ? AND escalated = 1 AND status = 'pending'",
            (dataset,),
        ).fetchone()
        return int(row[0])

    def commit_outcomes(
        self,
        outcomes: Iterable[Outcome],
        charges: Iterable[Charge] = (),
        settled: Iterable[int] = (),
        requeued: Iterable[str] = (),
    ) -> None:
        """Commit finished items (each one's result or failure, attempts and ledger charge) and
        charges learnt after the fact (`Charge.kind`), in one transaction, with the requests
        whose bills these are leaving `outstanding` (`settled`: their ids) in it too.
        `requeued`: items recorded as failed (in this batch or before) that are pending again
        (their error was the job's, not theirs)."""
        now = time.time()
        results: Rows = []
        failures: Rows = []
        attempts: Rows = []
        ledger: Rows = []
        done: Rows = []
        moved: Rows = []
        touched: Rows = []
        for o in outcomes:
            attempts.extend(
                (
                    o.item_id,
                    a.number,
                    a.started_at,
                    a.latency_s,
                    a.status,
                    a.failure_class,
                    a.message,
                    a.provider,
                    a.generation_id,
                    a.lane,
                )
                for a in o.attempts
            )
            r = o.result
            if r is not None:
                # Every answer is charged, a truncated one that moves on to another lane too.
                u = r.usage
                kind = "completion" if o.escalate_to is None else "escalated"
                ledger.append(
                    (
                        r.item_id,
                        o.dataset,
                        kind,
                        u.prompt_tokens,
                        u.completion_tokens,
                        u.cost_usd,
                        now,
                        r.endpoint,
                        r.provider,
                        r.generation_id,
                        o.attempts[-1].lane if o.attempts else None,
                    )
                )
            if o.escalate_to is not None and r is not None:
                moved.append((len(o.attempts), o.escalate_to, now, o.item_id))
            elif o.abandoned:
                touched.append((len(o.attempts), now, o.item_id))
            elif r is not None:
                m = r.message
                calls = (
                    json.dumps([tc.to_openai() for tc in m.tool_calls]) if m.tool_calls else None
                )
                results.append(
                    (
                        r.item_id,
                        o.dataset,
                        m.content,
                        m.reasoning,
                        calls,
                        r.finish_reason,
                        u.prompt_tokens,
                        u.completion_tokens,
                        u.reasoning_tokens,
                        u.cost_usd,
                        r.provider,
                        r.model,
                        r.generation_id,
                        r.latency_s,
                        now,
                        pack_ids(r.prompt_token_ids),
                        pack_ids(r.completion_token_ids),
                        None if u.source == "server" else u.source,
                    )
                )
                done.append((len(o.attempts), now, o.item_id))
            else:
                failures.append(
                    (len(o.attempts), o.failure_class, o.failure_message, now, o.item_id)
                )
        for c in charges:
            u = c.usage
            ledger.append(
                (
                    c.item_id,
                    c.dataset,
                    c.kind,
                    u.prompt_tokens,
                    u.completion_tokens,
                    u.cost_usd,
                    now,
                    c.endpoint,
                    c.provider,
                    c.generation_id,
                    c.lane,
                )
            )
        with self._tx() as db:
            db.executemany(
                "INSERT INTO attempts (item_id, number, started_at, latency_s, status, "
                "failure_class, message, provider, generation_id, lane) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                attempts,
            )
            db.executemany(
                "INSERT INTO results (item_id, dataset, content, reasoning, tool_calls, "
                "finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, "
                "provider, model, generation_id, latency_s, created_at, prompt_token_ids, "
                "completion_token_ids, usage_source) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                results,
            )
            db.executemany(
                "INSERT INTO ledger (item_id, dataset, kind, prompt_tokens, completion_tokens, "
                "cost_usd, created_at, endpoint, provider, generation_id, lane) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                ledger,
            )
            db.executemany(
                "UPDATE items SET status = 'done', attempts = attempts + ?, updated_at = ? "
                "WHERE id = ?",
                done,
            )
            db.executemany(
                "UPDATE items SET lane = ?2, escalated = 1, attempts = attempts + ?1, "
                "updated_at = ?3 WHERE id = ?4",
                moved,
            )
            db.executemany(
                "UPDATE items SET attempts = attempts + ?, updated_at = ? WHERE id = ?", touched
            )
            db.executemany(
                "UPDATE items SET status = 'failed', attempts = attempts + ?, failure_class = ?, "
                "failure_message = ?, updated_at = ? WHERE id = ?",
                failures,
            )
            Outstanding.write_in(db, (), (), settled)
            db.executemany(
                "UPDATE items SET status = 'pending', failure_class = NULL, "
                "failure_message = NULL WHERE id = ? AND status = 'failed'",
                [(i,) for i in requeued],
            )

    # reads

    def dataset_progress(self) -> list[DatasetProgress]:
        """Per-dataset counts and ledger totals, in the job's dataset order."""
        rows = self._db.execute(
            """
            SELECT d.name, d.position, d.rows_read, d.bad_rows, d.turns_read,
                   COALESCE(i.items, 0), COALESCE(i.done, 0), COALESCE(i.failed, 0),
                   COALESCE(l.pt, 0), COALESCE(l.ct, 0), COALESCE(l.cost, 0.0)
            FROM datasets d
            LEFT JOIN (
                -- Counted by (dataset, status) first: half the time of summing expressions
                -- over every item.
                SELECT dataset, SUM(n) AS items, SUM(CASE WHEN status = 'done' THEN n END) AS done,
                       SUM(CASE WHEN status = 'failed' THEN n END) AS failed
                FROM (SELECT dataset, status, COUNT(*) AS n FROM items GROUP BY dataset, status)
                GROUP BY dataset
            ) i ON i.dataset = d.name
            LEFT JOIN (
                SELECT dataset, SUM(prompt_tokens) AS pt, SUM(completion_tokens) AS ct,
                       SUM(COALESCE(cost_usd, 0)) AS cost
                FROM ledger GROUP BY dataset
            ) l ON l.dataset = d.name
            ORDER BY d.position
            """
        ).fetchall()
        return [DatasetProgress(*r) for r in rows]

    def dataset_samples(self) -> dict[str, DatasetSample]:
        """Per dataset: the estimates and latencies a forecast needs."""
        rows = self._db.execute(
            """
            SELECT i.dataset,
                   SUM(i.status = 'pending'),
                   SUM(CASE WHEN i.status = 'pending' THEN i.prompt_tokens_est ELSE 0 END),
                   SUM(CASE WHEN i.status = 'done' THEN i.prompt_tokens_est ELSE 0 END),
                   COALESCE(SUM(r.latency_s), 0.0)
            FROM items i LEFT JOIN results r ON r.item_id = i.id
            GROUP BY i.dataset
            """
        ).fetchall()
        return {r[0]: DatasetSample(*r) for r in rows}

    def result_facts(self) -> Iterator[tuple[str, float, int, float, str | None, str | None]]:
        """(dataset, finished at, completion tokens, latency, provider, finish reason) of
        every answer, for the report."""
        yield from self._db.execute(
            "SELECT dataset, created_at, completion_tokens, latency_s, provider, finish_reason "
            "FROM results"
        )

    def recent_completion_lengths(self, dataset: str, n: int) -> list[int]:
        """The completion tokens of a dataset's latest `n` answers."""
        rows = self._db.execute(
            "SELECT completion_tokens FROM results WHERE dataset = ? ORDER BY rowid DESC LIMIT ?",
            (dataset, n),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def answers_by_provider(self, providers: Sequence[str]) -> dict[str, int]:
        """How many answers each of these provider names served."""
        if not providers:
            return {}
        marks = ",".join("?" * len(providers))
        rows = self._db.execute(
            f"SELECT provider, COUNT(*) FROM results WHERE provider IN ({marks}) GROUP BY provider",
            tuple(providers),
        ).fetchall()
        return {str(p): int(n) for p, n in rows}

    def usage_sources(self) -> dict[tuple[str, str], int]:
        """Answers whose server sent no usage, by (dataset, how they were counted: `ids` or
        `estimate`)."""
        rows = self._db.execute(
            "SELECT dataset, usage_source, COUNT(*) FROM results WHERE usage_source IS NOT NULL "
            "GROUP BY dataset, usage_source"
        ).fetchall()
        return {(d, src): n for d, src, n in rows}

    def failure_counts(self) -> dict[tuple[str, str], int]:
        """Failed attempts by (dataset, class), from the attempt log."""
        rows = self._db.execute(
            "SELECT i.dataset, a.failure_class, COUNT(*) FROM attempts a "
            "JOIN items i ON i.id = a.item_id WHERE a.failure_class IS NOT NULL "
            "GROUP BY i.dataset, a.failure_class"
        ).fetchall()
        return {(d, c): n for d, c, n in rows}

    def recent_failures(self, limit: int = 10) -> list[FailedAttempt]:
        """The last failed attempts, newest first."""
        rows = self._db.execute(
            "SELECT a.started_at, i.dataset, a.item_id, a.failure_class, a.status, a.message "
            "FROM attempts a JOIN items i ON i.id = a.item_id "
            "WHERE a.failure_class IS NOT NULL ORDER BY a.id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [FailedAttempt(*r) for r in rows]

    def top_failure_reasons(self, limit: int = 5) -> list[tuple[str, str, int]]:
        """The commonest (class, message) of failed attempts, with their counts."""
        rows = self._db.execute(
            "SELECT failure_class, COALESCE(message, ''), COUNT(*) AS n FROM attempts "
            "WHERE failure_class IS NOT NULL GROUP BY failure_class, message "
            "ORDER BY n DESC, failure_class LIMIT ?",
            (limit,),
        ).fetchall()
        return [(c, m, n) for c, m, n in rows]

    def export_rows(self, dataset: str, since: float | None = None) -> Iterator[ExportRow]:
        """Done items of a dataset (answered after `since`, if given), in source row order,
        each exactly once."""
        cur = self._db.execute(
            f"SELECT {_EXPORT_COLUMNS} FROM results r JOIN items i ON i.id = r.item_id "
            "JOIN conversations c ON c.id = i.conversation_id "
            "WHERE r.dataset = ? AND r.created_at > ? ORDER BY c.row_index, i.turn_index",
            (dataset, -1.0 if since is None else since),
        )
        for r in cur:
            yield self._export_row(r)

    def _export_row(self, r: Sequence[Any]) -> ExportRow:
        regenerated = None
        if r[7] is not None:
            regenerated = {t: m.to_dict() for t, m in self.regenerated_turns(r[8], r[1]).items()}
        return ExportRow(
            item_id=r[0],
            turn_index=r[1],
            conversation=json.loads(r[2]),
            content=r[3],
            reasoning=r[4],
            tool_calls=json.loads(r[5]) if r[5] else [],
            finish_reason=r[6],
            regenerated=regenerated,
            conversation_id=r[8],
            provider=r[9],
            prompt_tokens=r[10],
            completion_tokens=r[11],
            cost_usd=r[12],
            created_at=r[13],
            prompt_token_ids=r[14],
            completion_token_ids=r[15],
        )

    def results_after(self, rowid: int, limit: int) -> list[tuple[int, str, ExportRow]]:
        """Up to `limit` answers stored after the answer with this rowid, oldest first, as
        (rowid, dataset, row): a cheap cursor over what a run commits."""
        rows = self._db.execute(
            f"SELECT {_EXPORT_COLUMNS}, r.rowid, r.dataset FROM results r "
            "JOIN items i ON i.id = r.item_id JOIN conversations c ON c.id = i.conversation_id "
            "WHERE r.rowid > ? ORDER BY r.rowid LIMIT ?",
            (rowid, limit),
        ).fetchall()
        return [(r[16], r[17], self._export_row(r)) for r in rows]

    # runs and their timeline

    def begin_run(
        self, kind: str, max_cost_usd: float | None, lanes: dict[str, dict[str, Any]]
    ) -> int:
        """Record that a run (or a pilot) starts now; its id."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs (kind, started_at, max_cost_usd, lanes) VALUES (?, ?, ?, ?)",
                (kind, time.time(), max_cost_usd, json.dumps(lanes, sort_keys=True)),
            )
            return int(cur.lastrowid or 0)

    def end_run(self, run_id: int, stop_reason: str | None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET ended_at = ?, stop_reason = ? WHERE id = ?",
                (time.time(), stop_reason, run_id),
            )

    def add_timeline(self, points: Iterable[TimelinePoint]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO timeline VALUES (?, ?, ?, ?, ?, ?)",
                [(p.run_id, p.t, p.lane, p.in_flight, p.limit, p.concurrency) for p in points],
            )

    def runs(self) -> list[RunRecord]:
        """Every run and pilot, oldest first; a killed one ends at its last timeline point."""
        rows = self._db.execute(
            "SELECT r.id, r.kind, r.started_at, "
            "COALESCE(r.ended_at, (SELECT MAX(t) FROM timeline WHERE run_id = r.id)), "
            "r.stop_reason, r.max_cost_usd, r.lanes FROM runs r ORDER BY r.id"
        ).fetchall()
        return [RunRecord(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    def timeline(self) -> list[TimelinePoint]:
        rows = self._db.execute(
            "SELECT run_id, t, lane, in_flight, limit_now, concurrency FROM timeline "
            "ORDER BY run_id, t"
        ).fetchall()
        return [TimelinePoint(*r) for r in rows]

    def lane_capacity(self, recent: int = 20_000) -> dict[str, LaneCapacity]:
        """Per lane, what its provider let it keep on the wire (see LaneCapacity)."""
        out: dict[str, LaneCapacity] = {}
        refused = dict(
            self._db.execute(
                "SELECT lane, COUNT(*) FROM attempts WHERE lane IS NOT NULL AND "
                "(status = 429 OR failure_class = 'rate_limited') GROUP BY lane"
            ).fetchall()
        )
        spans: dict[str, list[tuple[float, int]]] = {}
        for lane, start, latency in self._db.execute(
            "SELECT lane, started_at, latency_s FROM attempts WHERE lane IS NOT NULL AND "
            "failure_class IS NULL ORDER BY id DESC LIMIT ?",
            (recent,),
        ):
            events = spans.setdefault(lane, [])
            events.append((start, 1))
            events.append((start + latency, -1))
        for lane, events in spans.items():
            now = most = 0
            for _, step in sorted(events):
                now += step
                most = max(most, now)
            out[lane] = LaneCapacity(int(refused.get(lane, 0)), most, None, 0)
        last_run = self._db.execute(
            "SELECT id, started_at, ended_at FROM runs WHERE kind = 'run' AND ended_at IS NOT "
            "NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if last_run is not None:
            run_id, start, end = last_run
            lo, hi = start + 0.1 * (end - start), start + 0.9 * (end - start)
            for lane, mean, n in self._db.execute(
                "SELECT lane, AVG(in_flight), COUNT(*) FROM timeline "
                "WHERE run_id = ? AND t BETWEEN ? AND ? GROUP BY lane",
                (run_id, lo, hi),
            ):
                if lane in out:
                    out[lane] = replace(out[lane], run_in_flight=float(mean), run_samples=n)
        return out

    def attempt_facts(self) -> Iterator[AttemptFact]:
        """Every attempt, in the order recorded."""
        for r in self._db.execute(
            "SELECT a.started_at, a.latency_s, a.status, a.failure_class, i.dataset, a.lane "
            "FROM attempts a JOIN items i ON i.id = a.item_id ORDER BY a.id"
        ):
            yield AttemptFact(*r)

    def ledger_facts(self) -> Iterator[tuple[float, float, str, str]]:
        """(charged at, USD, kind, dataset) of every charge, in the order made; kind is
        `completion`, `escalated` (a truncated answer sent again on a longer lane), or one of
        the charges learnt after the fact (`Charge.kind`)."""
        yield from self._db.execute(
            "SELECT created_at, COALESCE(cost_usd, 0.0), kind, dataset FROM ledger ORDER BY id"
        )

    def item_lanes(self) -> dict[tuple[str, str | None, bool], int]:
        """Done items by (dataset, the lane that answered, whether a shorter lane's truncated
        answer was escalated to it)."""
        rows = self._db.execute(
            "SELECT dataset, lane, escalated, COUNT(*) FROM items WHERE status = 'done' "
            "GROUP BY dataset, lane, escalated"
        ).fetchall()
        return {(d, lane, bool(e)): n for d, lane, e, n in rows}

    def pending_flows(self) -> dict[tuple[str | None, str], tuple[int, int]]:
        """Pending items per (lane, dataset): how many, and their estimated prompt tokens."""
        rows = self._db.execute(
            "SELECT lane, dataset, COUNT(*), COALESCE(SUM(prompt_tokens_est), 0) FROM items "
            "WHERE status = 'pending' GROUP BY lane, dataset"
        ).fetchall()
        return {(lane, ds): (n, est) for lane, ds, n, est in rows}

    def flow_entries(self) -> Iterator[FlowEntry]:
        """Every finished passage of an item through a lane (its answer, its failure, or the
        truncated answer that sent it on to a longer lane), with what it took there. Charges
        and attempts recorded before lanes were (lane NULL) count in the item's lane now."""
        yield from (
            FlowEntry(*r)
            for r in self._db.execute(
                """
                WITH a AS (
                    SELECT a.item_id, COALESCE(a.lane, i.lane) AS lane, i.dataset,
                           i.prompt_tokens_est AS est,
                           CASE WHEN i.status != 'pending' AND COALESCE(a.lane, i.lane) = i.lane
                                THEN i.status ELSE 'escalated' END AS outcome,
                           COUNT(*) AS attempts, SUM(a.latency_s) AS wire_s,
                           MAX(a.started_at + a.latency_s) - MIN(a.started_at) AS span_s,
                           SUM(a.failure_class IS NULL) AS ok
                    FROM attempts a JOIN items i ON i.id = a.item_id
                    WHERE i.status != 'pending' OR COALESCE(a.lane, i.lane) != i.lane
                    GROUP BY a.item_id, COALESCE(a.lane, i.lane)
                ),
                l AS (
                    SELECT l.item_id, COALESCE(l.lane, i.lane) AS lane,
                           SUM(l.prompt_tokens) AS pt, SUM(l.completion_tokens) AS ct,
                           SUM(COALESCE(l.cost_usd, 0)) AS usd
                    FROM ledger l JOIN items i ON i.id = l.item_id
                    GROUP BY l.item_id, COALESCE(l.lane, i.lane)
                )
                SELECT a.lane, a.dataset, a.outcome, a.est, a.attempts, a.ok, a.wire_s,
                       a.span_s, COALESCE(l.pt, 0), COALESCE(l.ct, 0), COALESCE(l.usd, 0.0)
                FROM a LEFT JOIN l ON l.item_id = a.item_id AND l.lane = a.lane
                """
            )
        )

    def answer_latencies(self, lane: str, limit: int = 4096) -> list[float]:
        """Times on the wire of a lane's latest successful attempts."""
        rows = self._db.execute(
            "SELECT a.latency_s FROM attempts a JOIN items i ON i.id = a.item_id "
            "WHERE COALESCE(a.lane, i.lane) = ? AND a.failure_class IS NULL "
            "ORDER BY a.id DESC LIMIT ?",
            (lane, limit),
        ).fetchall()
        return [float(r[0]) for r in rows]

    def lane_answers(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Answers per (lane, dataset) charged so far, and how many of them were truncated
        and sent on to a longer lane."""
        rows = self._db.execute(
            "SELECT lane, dataset, COUNT(*), SUM(kind = 'escalated') FROM ledger "
            "WHERE lane IS NOT NULL AND kind IN ('completion', 'escalated') "
            "GROUP BY lane, dataset"
        ).fetchall()
        return {(lane, ds): (n, e) for lane, ds, n, e in rows}

    def earlier_latencies(
        self, limit: int = 20_000
    ) -> dict[tuple[str | None, str], list[tuple[float, int]]]:
        """Times on the wire of the latest successful attempts (up to `limit`), with their
        items' estimated prompt tokens, by (lane, dataset): what a new run's ETA starts from."""
        out: dict[tuple[str | None, str], list[tuple[float, int]]] = {}
        for lane, ds, t, est in self._db.execute(
            "SELECT COALESCE(a.lane, i.lane), i.dataset, a.latency_s, i.prompt_tokens_est "
            "FROM attempts a JOIN items i ON i.id = a.item_id WHERE a.failure_class IS NULL "
            "ORDER BY a.id DESC LIMIT ?",
            (limit,),
        ):
            out.setdefault((lane, ds), []).append((float(t), int(est)))
        return out

    def last_result_rowid(self) -> int:
        row = self._db.execute("SELECT max(rowid) FROM results").fetchone()
        return int(row[0] or 0)

    def regenerated_turns(self, conversation_id: str, before_turn: int) -> dict[int, Message]:
        """The done answers of a conversation's turns before `before_turn`, as assistant
        messages by turn index (what sequential mode sends as history)."""
        rows = self._db.execute(
            "SELECT i.turn_index, r.content, r.reasoning, r.tool_calls FROM items i "
            "JOIN results r ON r.item_id = i.id "
            "WHERE i.conversation_id = ? AND i.turn_index < ?",
            (conversation_id, before_turn),
        ).fetchall()
        return {
            t: Message(
                "assistant",
                content,
                reasoning=reasoning,
                tool_calls=tuple(ToolCall.from_openai(tc) for tc in json.loads(calls or "[]")),
            )
            for t, content, reasoning, calls in rows
        }
