"""The work to do: conversations, their items (one per turn to regenerate), the lanes that
take them and their status (tables `conversations`, `items`)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from regen.errors import StateError
from regen.state.owner import Owner, Rows
from regen.state.reads import (
    READ_MARK,
    READ_TABLES,
    ViewChange,
    drop_read_tables,
    insert_seen_conversations,
    remember_in,
    settle_in,
)
from regen.state.schema import has_column

if TYPE_CHECKING:
    from regen.state.outcomes import OutcomeRows


DEFERRED_INDEXES = {
    "items_dispatch": "CREATE INDEX IF NOT EXISTS items_dispatch ON items "
    "(dataset, status, order_key)",
    "items_lane": "CREATE INDEX IF NOT EXISTS items_lane ON items "
    "(lane, dataset, status, escalated, order_key, prompt_tokens_est)",
}
"""Indexes on items that a first read into an empty table builds after its rows are in
(Work.add_conversation_batches): their keys are random, and inserting a million of them
one by one took 5 s more than sorting them once. They are dropped in the same transaction
that records so in meta (DEFERRED_META), and Store.open builds them while it is there: a kill
in between leaves nothing the next run does not mend. The other indexes stay: the unique
ones decide which rows are new."""


DEFERRED_META = "deferred_indexes"


PILOT_INDEX = (
    "CREATE INDEX IF NOT EXISTS items_pilot ON items (lane, dataset, status, escalated, pilot_key)"
)
"""A pilot's claims (Work.claim_batch), built by the first pilot rather than at every read:
a million random keys took 3-4 s of a 55 s read (bench/ingest.py), and most jobs never
pilot."""


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
    orphans: int = 0
    """Answers to rows (or turns) the dataset's latest complete read no longer found: kept in
    state.db, left out of exports unless asked, and of no other count here (items, done)."""
    cached_tokens: int = 0
    """Of the prompt tokens charged, those read from the providers' prompt caches."""
    cache_write_tokens: int = 0
    """Of the prompt tokens charged, those written to a cache where writes are billed apart."""

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
    """The lane that takes it (first_lane), as Work.assign_lanes would give it."""
    sample: int = 0
    """Which of its prompt's samples it is."""
    pilot_key: int | None = None
    """Its own place in the dataset's seeded shuffle, which a pilot claims by (None: its
    order key, when that is the shuffle)."""


@dataclass(frozen=True, slots=True)
class NewConversation:
    """A source row to insert: its id, the normalized conversation as JSON, and its items."""

    id: str
    dataset: str
    row_index: int
    data: str
    items: list[NewItem]
    source_id: str | None = None
    """The row's own id in its source (custom_id, id, ...), where it has one."""


@dataclass(frozen=True, slots=True)
class LaneRule:
    """Which pending items a lane takes: by dataset and estimated prompt tokens."""

    name: str
    datasets: list[str] | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None

    def selects(self, dataset: str, prompt_tokens_est: int) -> bool:
        """Whether the rule takes an item (what Work.assign_lanes asks in SQL)."""
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
class PromptShape:
    """The pending prompts of one (lane, dataset), by conversation: what a prompt cache can
    serve of them (a conversation's turns extend each other; a prompt's samples repeat it)."""

    items: int
    conversations: int
    est: int
    """Their estimated prompt tokens."""
    longest: int
    """Over conversations, the estimated tokens of each one's longest pending prompt."""


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
    sample: int = 0
    pilot_key: int = 0
    """Its own place in its dataset's seeded shuffle (a pilot's claims go by it)."""
    escalated_at: float = 0.0
    """When it was escalated to its lane (0: it was not): escalated items go out in this
    order."""


_PENDING_COLUMNS = (
    "i.id, i.dataset, i.turn_index, i.order_key, c.data, c.row_index, c.id, i.prompt_tokens_est, "
    "i.after_item, i.sample, i.pilot_key, IFNULL(i.escalated_at, 0) "
    "FROM items i JOIN conversations c ON c.id = i.conversation_id"
)


INGEST_COMMIT_ROWS = 250_000
"""Rows per transaction while a source is read (Work.add_conversation_batches)."""


INGEST_SORT_ROWS = 50_000
"""Rows inserted at once in key order while a source is read (a commit holds several)."""


INGEST_CACHE_KIB = 512 * 1024
"""SQLite's page cache while a source is read: about the indexes of 2M items."""


def _add_rows(batch: Iterable[NewConversation], conv_rows: Rows, item_rows: Rows) -> None:
    """The conversations' and their items' table rows, appended in the source's order."""
    for conv in batch:
        cid = conv.id
        conv_rows.append((cid, conv.dataset, conv.row_index, conv.data, conv.source_id))
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
                it.sample,
                it.order_key if it.pilot_key is None else it.pilot_key,
            )
            for it in conv.items
        )


def _defer_indexes_if_empty(tx: sqlite3.Connection) -> bool:
    """Into an empty items table, drop the DEFERRED_INDEXES (marked in meta, so that an
    interrupted ingest's next open builds them) and say so; otherwise leave them."""
    deferred = tx.execute("SELECT 1 FROM items LIMIT 1").fetchone() is None
    if deferred:
        for name in DEFERRED_INDEXES:
            tx.execute(f"DROP INDEX IF EXISTS {name}")
        tx.execute("INSERT OR REPLACE INTO meta VALUES (?, '1')", [DEFERRED_META])
    return deferred


def _insert_one_commit(
    tx: sqlite3.Connection,
    pending: Iterator[Iterable[NewConversation]],
    commit_rows: int,
    sort_rows: int,
    seen: bool,
) -> tuple[int, bool]:
    """Insert batches from `pending`, `sort_rows` at a time, until one commit's worth
    (`commit_rows`) is in or the batches run out: how many items are new, and whether
    batches may be left."""
    added = 0
    rows = 0
    conv_rows: Rows = []
    item_rows: Rows = []
    for batch in pending:
        _add_rows(batch, conv_rows, item_rows)
        if len(conv_rows) >= sort_rows:
            added += _insert_sorted(tx, conv_rows, item_rows, seen)
            rows += len(conv_rows)
            conv_rows, item_rows = [], []
        if rows >= commit_rows:
            return added + _insert_sorted(tx, conv_rows, item_rows, seen), True
    return added + _insert_sorted(tx, conv_rows, item_rows, seen), False


def _insert_sorted(
    db: sqlite3.Connection, conv_rows: Rows, item_rows: Rows, seen: bool = False
) -> int:
    """_insert_rows with conversations in id order and items in prompt-hash order. The sorts
    are stable: of two rows with the same key, the earlier still goes in first, and wins."""
    conv_rows.sort(key=itemgetter(0))
    item_rows.sort(key=itemgetter(4))
    return _insert_rows(db, conv_rows, item_rows, seen)


def _insert_rows(
    db: sqlite3.Connection, conv_rows: Rows, item_rows: Rows, seen: bool = False
) -> int:
    """Insert conversations and items (_add_rows) in the open transaction; return the new
    items. Where two rows have the same id, or two items the same prompt, the earlier wins.
    `seen`: also remember them as what the read under way yields (Work.start_read), and move
    a stored row to the place this read first finds it at (with that place's own id)."""
    if seen:
        conv_rows = insert_seen_conversations(db, conv_rows)
    else:
        db.executemany(
            "INSERT OR IGNORE INTO conversations (id, dataset, row_index, data, source_id) "
            "VALUES (?, ?, ?, ?, ?)",
            conv_rows,
        )
    mid = db.total_changes
    # The pilot key has a column since m016 (a test may write a state.db of an older schema).
    if has_column(db, "items", "pilot_key"):
        columns, marks, rows = ", pilot_key", ", ?", item_rows
    else:
        columns, marks, rows = "", "", [r[:-1] for r in item_rows]
    db.executemany(
        "INSERT OR IGNORE INTO items (id, dataset, conversation_id, turn_index, prompt_hash, "
        f"order_key, prompt_tokens_est, after_item, lane, sample{columns}) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?{marks})",
        rows,
    )
    added = db.total_changes - mid
    if seen:
        remember_in(db, conv_rows, item_rows)
    return added


def _pending(rows: list[tuple[Any, ...]]) -> list[PendingItem]:
    """Claimed rows as items. Items of one conversation share its data, read once: they are
    claimed together, and a long conversation's turns would each hold a copy (the feeder keeps
    some in memory while their first turn is computed)."""
    parsed: dict[str, dict[str, Any]] = {}
    items = []
    for r in rows:
        data = parsed.get(r[6])
        if data is None:
            data = parsed[r[6]] = json.loads(r[4])
        items.append(PendingItem(r[0], r[1], r[2], r[3], data, *r[5:]))
    return items


class ItemShapes(Owner):
    """What the plan reads of the items: their lanes, prompts and conversations (read only)."""

    def _gone(self, sql: str) -> str:
        """`sql`, which reads the items gone from view, or nothing in a state.db from before
        m013 (read-only readers do not migrate it: every item is in view there)."""
        return sql if has_column(self._db, "items", "gone") else ""

    def item_lanes(self) -> dict[tuple[str, str | None, bool], int]:
        """Done items by (dataset, the lane that answered, whether a shorter lane's truncated
        answer was escalated to it)."""
        rows = self._db.execute(
            "SELECT dataset, lane, escalated, COUNT(*) FROM items WHERE status = 'done' "
            "GROUP BY dataset, lane, escalated"
        ).fetchall()
        return {(d, lane, bool(e)): n for d, lane, e, n in rows}

    def prompt_shapes(self) -> dict[tuple[str | None, str], PromptShape]:
        """Per (lane, dataset), its pending prompts in view grouped by conversation."""
        rows = self._db.execute(
            "SELECT lane, dataset, SUM(n), COUNT(*), SUM(est), SUM(longest) FROM ("
            " SELECT lane, dataset, COUNT(*) AS n, SUM(prompt_tokens_est) AS est,"
            " MAX(prompt_tokens_est) AS longest FROM items WHERE status = 'pending'"
            f"{self._gone(' AND gone = 0')} GROUP BY lane, dataset, conversation_id"
            ") GROUP BY lane, dataset"
        ).fetchall()
        return {(lane, ds): PromptShape(*map(int, rest)) for lane, ds, *rest in rows}

    def pending_flows(self) -> dict[tuple[str | None, str], tuple[int, int]]:
        """Pending items in view per (lane, dataset): how many, and their estimated prompt
        tokens."""
        gone = self._gone(
            " UNION ALL SELECT lane, dataset, -COUNT(*), -COALESCE(SUM(prompt_tokens_est), 0)"
            " FROM items INDEXED BY items_gone WHERE status = 'pending' AND gone = 1"
            " GROUP BY lane, dataset"
        )
        rows = self._db.execute(
            "SELECT lane, dataset, SUM(n), SUM(est) FROM ("
            " SELECT lane, dataset, COUNT(*) AS n, COALESCE(SUM(prompt_tokens_est), 0) AS est"
            f" FROM items WHERE status = 'pending' GROUP BY lane, dataset{gone}"
            ") GROUP BY lane, dataset HAVING SUM(n) > 0"
        ).fetchall()
        return {(lane, ds): (int(n), int(est)) for lane, ds, n, est in rows}


class Work(ItemShapes):
    """The `conversations` and `items` tables."""

    _reading: str | None = None
    """The dataset whose read is under way and remembered (start_read), if any."""
    _temp_cache: int = -2000
    """The temporary tables' page cache before a read enlarged it."""

    @staticmethod
    def finish_in(db: sqlite3.Connection, rows: OutcomeRows, requeued: Iterable[str]) -> None:
        """Move items on as a commit's outcomes say (done, escalated, touched, failed), and
        make `requeued` failed items pending again, in the open transaction."""
        db.executemany(
            "UPDATE items SET status = 'done', attempts = attempts + ?, updated_at = ? "
            "WHERE id = ?",
            rows.done,
        )
        if rows.moved:  # (a test may commit to a state.db from before m018)
            db.executemany(
                "UPDATE items SET lane = ?2, escalated = 1, attempts = attempts + ?1, "
                "updated_at = ?3, escalated_at = ?3 WHERE id = ?4",
                rows.moved,
            )
        db.executemany(
            "UPDATE items SET attempts = attempts + ?, updated_at = ? WHERE id = ?",
            rows.touched,
        )
        db.executemany(
            "UPDATE items SET status = 'failed', attempts = attempts + ?, failure_class = ?, "
            "failure_message = ?, updated_at = ? WHERE id = ?",
            rows.failures,
        )
        db.executemany(
            "UPDATE items SET status = 'pending', failure_class = NULL, "
            "failure_message = NULL WHERE id = ? AND status = 'failed'",
            [(i,) for i in requeued],
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
            return _insert_rows(db, conv_rows, item_rows, self._reading is not None)

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
        (_insert_sorted), so that each index page takes its keys together. During a read
        start_read began, what the rows yield is remembered for settle_view.
        """
        db = self._db
        seen = self._reading is not None
        (cache,) = db.execute("PRAGMA cache_size").fetchone()
        db.execute(f"PRAGMA cache_size = {-INGEST_CACHE_KIB}")
        db.execute("PRAGMA foreign_keys = OFF")
        added = 0
        deferred: bool | None = None
        try:
            pending = iter(batches)
            more = True
            while more:
                with self._tx() as tx:
                    if deferred is None:
                        deferred = _defer_indexes_if_empty(tx)
                    new, more = _insert_one_commit(tx, pending, commit_rows, sort_rows, seen)
                    added += new
            if deferred:
                self.build_deferred_indexes()
        except BaseException:
            if deferred:
                # Best effort: what is not built now, the next Store.open builds.
                with contextlib.suppress(StateError):
                    self.build_deferred_indexes()
            raise
        finally:
            db.execute("PRAGMA foreign_keys = ON")
            db.execute(f"PRAGMA cache_size = {int(cache)}")
        return added

    def build_deferred_indexes(self) -> None:
        """Build the DEFERRED_INDEXES if a read dropped them (a write only then)."""
        marked = self._db.execute("SELECT 1 FROM meta WHERE key = ?", (DEFERRED_META,))
        if marked.fetchone() is None:
            return
        with self._tx() as tx:
            for sql in DEFERRED_INDEXES.values():
                tx.execute(sql)
            tx.execute("DELETE FROM meta WHERE key = ?", (DEFERRED_META,))

    def start_read(self, dataset: str) -> None:
        """Begin a complete read of a dataset: until settle_view, the rows and items that
        add_conversation_batches stores are remembered, so that its end can tell which of
        the dataset's items the source no longer yields. A dataset without items yet needs
        nothing remembered: none can leave."""
        self._reading = None
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO meta VALUES (?, (SELECT COALESCE(MAX(rowid), 0) "
                "FROM conversations))",
                (f"{READ_MARK} {dataset}",),
            )
            if db.execute("SELECT 1 FROM items WHERE dataset = ? LIMIT 1", (dataset,)).fetchone():
                drop_read_tables(db)
                for sql in READ_TABLES:
                    db.execute(sql)
                self._reading = dataset
        if self._reading is not None:
            # What a read remembers is keyed by hashes: it is inserted at random places, as
            # the indexes are (add_conversation_batches), and a small cache would thrash.
            (self._temp_cache,) = self._db.execute("PRAGMA temp.cache_size").fetchone()
            self._db.execute(f"PRAGMA temp.cache_size = {-INGEST_CACHE_KIB}")

    def settle_view(self, dataset: str) -> ViewChange:
        """End a complete read begun by start_read: in one transaction, the dataset's items
        the read did not yield leave the view (gone: never sent, their answers kept but out
        of exports) and those it yields again come back. Returns what changed since the last
        complete read. A read cut short never gets here, and the view of the last complete
        read stands."""
        key = f"{READ_MARK} {dataset}"
        if self._reading != dataset:
            with self._tx() as db:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            return ViewChange()
        try:
            with self._tx() as db:
                (mark,) = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
                change = settle_in(db, dataset, int(mark))
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
        finally:
            self.forget_read()
        return change

    def forget_read(self) -> None:
        """Stop remembering a read (one that failed is not settled: the view stands)."""
        if self._reading is None:
            return
        self._reading = None
        with contextlib.suppress(sqlite3.Error):
            drop_read_tables(self._db)
            self._db.execute(f"PRAGMA temp.cache_size = {int(self._temp_cache)}")

    def requeue_retryable_failures(self, retryable: Iterable[str]) -> int:
        """Give items that failed for a transient reason in an earlier run another chance."""
        classes = sorted(retryable)
        marks = ",".join("?" * len(classes))
        with self._tx() as db:
            cur = db.execute(
                "UPDATE items SET status = 'pending', failure_class = NULL, failure_message = NULL"
                f" WHERE status = 'failed' AND failure_class IN ({marks}) AND gone = 0",
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
            # An escalated item with no time of escalation (a state.db written elsewhere)
            # would never be claimed (claim_escalated goes by it): it comes first.
            db.execute(
                "UPDATE items SET escalated_at = 0 WHERE status = 'pending' AND escalated = 1 "
                "AND escalated_at IS NULL"
            )
            db.execute(
                f"UPDATE items SET lane = {lane} WHERE status = 'pending' "
                f"AND (escalated = 0 OR lane IS NULL) AND lane IS NOT ({lane})",
                [*args, *args],
            )
            rows = db.execute(
                "SELECT dataset, COUNT(*) FROM items WHERE lane IS NULL AND status = 'pending' "
                "AND gone = 0 GROUP BY dataset"
            ).fetchall()
        return {ds: n for ds, n in rows}

    def claim_batch(
        self,
        dataset: str,
        after_key: int,
        limit: int,
        lane: str | None = None,
        *,
        pilot: bool = False,
    ) -> list[PendingItem]:
        """The next pending items of a dataset (in a lane) in dispatch order (keyset on
        order_key), or for a pilot in the dataset's shuffle (keyset on pilot_key: a sample
        spread over the conversations, not a few whole ones). Escalated items are claimed
        separately."""
        key = "pilot_key" if pilot else "order_key"
        if pilot:  # a few claims a pilot: nothing to build after its first
            with self._tx() as tx:
                tx.execute(PILOT_INDEX)
        lane_sql = "AND i.lane = ? AND i.escalated = 0 " if lane is not None else ""
        args: tuple[Any, ...] = (dataset, after_key, *((lane,) if lane else ()), limit)
        # An item of a sequential conversation waits until its previous turn is done.
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} "
            f"WHERE i.dataset = ? AND i.status = 'pending' AND i.{key} > ? AND i.gone = 0 "
            "AND (i.after_item IS NULL OR "
            "(SELECT p.status FROM items p WHERE p.id = i.after_item) = 'done') "
            f"{lane_sql}ORDER BY i.{key} LIMIT ?",
            args,
        ).fetchall()
        return _pending(rows)

    def blocked_items(self) -> dict[str, int]:
        """Pending turns of sequential conversations whose earlier turn failed, per dataset."""
        rows = self._db.execute(
            "WITH RECURSIVE blocked(id, dataset) AS ("
            " SELECT i.id, i.dataset FROM items i JOIN items p ON p.id = i.after_item"
            " WHERE i.status = 'pending' AND p.status = 'failed' AND i.gone = 0"
            " UNION SELECT i.id, i.dataset FROM items i JOIN blocked b ON i.after_item = b.id"
            " WHERE i.status = 'pending')"
            " SELECT dataset, COUNT(*) FROM blocked GROUP BY dataset"
        ).fetchall()
        return {ds: n for ds, n in rows}

    def claim_escalated(
        self, lane: str, limit: int, after: tuple[float, int, str] | None = None
    ) -> list[PendingItem]:
        """Pending items escalated to a lane in the order they were escalated (those of one
        commit in dispatch order), after `(escalated_at, order_key, id)` (keyset: the first
        page is mostly items already in flight on a wide lane)."""
        at, key, item = after if after is not None else (-1.0, -1, "")
        rows = self._db.execute(
            f"SELECT {_PENDING_COLUMNS} "
            "WHERE i.lane = ? AND i.escalated = 1 AND i.status = 'pending' AND i.gone = 0 "
            "AND (i.escalated_at, i.order_key, i.id) > (?, ?, ?) "
            "ORDER BY i.escalated_at, i.order_key, i.id LIMIT ?",
            (lane, at, key, item, limit),
        ).fetchall()
        return _pending(rows)

    def is_pending(self, item_id: str) -> bool:
        row = self._db.execute("SELECT status FROM items WHERE id = ?", (item_id,)).fetchone()
        return row is not None and row[0] == "pending"

    def escalated_pending(self, dataset: str) -> int:
        """Items of a dataset escalated to another lane and not finished yet."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM items WHERE dataset = ? AND escalated = 1 AND status = 'pending' "
            "AND gone = 0",
            (dataset,),
        ).fetchone()
        return int(row[0])

    def dataset_progress(self) -> list[DatasetProgress]:
        """Per-dataset counts and ledger totals, in the job's dataset order. Items out of the
        view (gone) count only as orphans, if answered; the ledger keeps what they cost."""
        gone = self._gone(
            "UNION ALL SELECT dataset, status, -COUNT(*) FROM items INDEXED BY items_gone "
            "WHERE gone = 1 GROUP BY dataset, status"
        )
        # A state.db from before m015 (read, not migrated, by `regen status`) has no cache use.
        cache = (
            "SUM(cached_tokens) AS cached, SUM(cache_write_tokens) AS written"
            if has_column(self._db, "ledger", "cached_tokens")
            else "0 AS cached, 0 AS written"
        )
        rows = self._db.execute(
            f"""
            SELECT d.name, d.position, d.rows_read, d.bad_rows, d.turns_read,
                   COALESCE(i.items, 0), COALESCE(i.done, 0), COALESCE(i.failed, 0),
                   COALESCE(l.pt, 0), COALESCE(l.ct, 0), COALESCE(l.cost, 0.0),
                   COALESCE(i.orphans, 0), COALESCE(l.cached, 0), COALESCE(l.written, 0)
            FROM datasets d
            LEFT JOIN (
                -- Counted by (dataset, status) first: half the time of summing expressions
                -- over every item. The items gone, from their own partial index, are taken
                -- off the counts (`n` negative) and kept apart as orphans.
                SELECT dataset, SUM(n) AS items, SUM(CASE WHEN status = 'done' THEN n END) AS done,
                       SUM(CASE WHEN status = 'failed' THEN n END) AS failed,
                       -SUM(CASE WHEN status = 'done' AND n < 0 THEN n END) AS orphans
                FROM (SELECT dataset, status, COUNT(*) AS n FROM items GROUP BY dataset, status
                      {gone})
                GROUP BY dataset
            ) i ON i.dataset = d.name
            LEFT JOIN (
                SELECT dataset, SUM(prompt_tokens) AS pt, SUM(completion_tokens) AS ct,
                       SUM(COALESCE(cost_usd, 0)) AS cost, {cache}
                FROM ledger GROUP BY dataset
            ) l ON l.dataset = d.name
            ORDER BY d.position
            """
        ).fetchall()
        return [DatasetProgress(*r) for r in rows]

    def dataset_samples(self) -> dict[str, DatasetSample]:
        """Per dataset: the estimates and latencies a forecast needs."""
        rows = self._db.execute(
            f"""
            SELECT i.dataset,
                   SUM(i.status = 'pending'),
                   SUM(CASE WHEN i.status = 'pending' THEN i.prompt_tokens_est ELSE 0 END),
                   SUM(CASE WHEN i.status = 'done' THEN i.prompt_tokens_est ELSE 0 END),
                   COALESCE(SUM(r.latency_s), 0.0)
            FROM items i LEFT JOIN results r ON r.item_id = i.id
            {self._gone("WHERE i.gone = 0")}
            GROUP BY i.dataset
            """
        ).fetchall()
        return {r[0]: DatasetSample(*r) for r in rows}
