"""A complete read of a dataset and the view it leaves: which of the dataset's items its source
still yields (`items.gone` is 0), with what changed since the last complete read.

While a read is under way (Work.start_read) the rows and items it stores are remembered in
temporary tables of the store's connection; its end (Work.settle_view) moves out of the view
the dataset's items it did not yield and back those it yields again, in one transaction. A
read cut short is never settled and leaves nothing behind: the last complete read's view
stands. Work's implementation: these write Work's tables, in the transaction it opens."""

from __future__ import annotations

import sqlite3
from dataclasses import astuple, dataclass
from typing import Any

from regen.state.owner import Rows


@dataclass(frozen=True, slots=True)
class ViewChange:
    """What a complete read changed in its dataset's view since the last complete read.

    Rows are conversations: `changed` counts places where a row of the last read is gone and
    a row it did not have stands (the content at that place changed); `added` and `removed`
    count the others. Items and answers are counted by whether they left the view or came
    back to it (a row back in the file, or a turn its settings select again)."""

    added: int = 0
    removed: int = 0
    changed: int = 0
    left_pending: int = 0
    """Items no longer in view that were never answered: they are not sent."""
    left_answers: int = 0
    """Answers no longer in view: kept, and left out of exports unless asked."""
    back_answers: int = 0
    """Answers back in view (and in exports)."""

    def __bool__(self) -> bool:
        return any(astuple(self))


READ_TABLES = (
    "CREATE TEMP TABLE read_rows (id TEXT PRIMARY KEY, row_index INTEGER "
    "NOT NULL, source_id TEXT) WITHOUT ROWID",
    "CREATE TEMP TABLE read_items (id TEXT PRIMARY KEY, prompt_hash TEXT NOT NULL) WITHOUT ROWID",
    "CREATE INDEX temp.read_items_prompt ON read_items (prompt_hash)",
    "CREATE TEMP TABLE view_left (id TEXT PRIMARY KEY, conversation_id TEXT "
    "NOT NULL, status TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TEMP TABLE view_back (id TEXT PRIMARY KEY, conversation_id TEXT "
    "NOT NULL, status TEXT NOT NULL) WITHOUT ROWID",
)
"""What a read under way yields (its rows with their places, its items by id and prompt), and
the items its end moves out of the view or back: temporary tables of the store's connection,
gone with it, so that a read cut short leaves nothing the next one must undo."""


def drop_read_tables(db: sqlite3.Connection) -> None:
    """Forget what a read remembered."""
    for table in ("read_rows", "read_items", "view_left", "view_back"):
        db.execute(f"DROP TABLE IF EXISTS temp.{table}")


READ_MARK = "read_mark"
"""meta `read_mark <dataset>`: the last conversation rowid stored before the first read of
the dataset since its last complete one. Rows stored after it are rows that read added."""


def insert_seen_conversations(db: sqlite3.Connection, conv_rows: Rows) -> Rows:
    """Insert the conversations of a read under way; a stored one moves to the place this read
    first finds it at, with that place's own id (its provenance names the file as it is now).
    Returns the rows, each id once (the first of a group of the same id)."""
    first: dict[str, tuple[Any, ...]] = {}
    for r in conv_rows:
        first.setdefault(r[0], r)
    rows = list(first.values())
    db.executemany(
        "INSERT INTO conversations (id, dataset, row_index, data, source_id) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET row_index = "
        "excluded.row_index, source_id = excluded.source_id WHERE (row_index IS NOT "
        "excluded.row_index OR source_id IS NOT excluded.source_id) AND id NOT IN "
        "(SELECT id FROM temp.read_rows)",
        rows,
    )
    return rows


def remember_in(db: sqlite3.Connection, conv_rows: Rows, item_rows: Rows) -> None:
    """Remember a read's rows (with their places) and items, as _insert_rows has them."""
    db.executemany(
        "INSERT OR IGNORE INTO temp.read_rows VALUES (?, ?, ?)",
        [(r[0], r[2], r[4]) for r in conv_rows],
    )
    # By id and by prompt: an item a row yields may be stored under either (a prompt
    # another row had first is that row's item; a turn whose prompt key changed, its own).
    db.executemany(
        "INSERT OR IGNORE INTO temp.read_items VALUES (?, ?)",
        [(r[0], r[4]) for r in item_rows],
    )


def settle_in(db: sqlite3.Connection, dataset: str, mark: int) -> ViewChange:
    """Work.settle_view's writes and counts, in the open transaction (READ_TABLES hold what the
    read yielded; `mark` is READ_MARK's value)."""
    yielded = (
        "(i.id IN (SELECT id FROM temp.read_items) "
        "OR i.prompt_hash IN (SELECT prompt_hash FROM temp.read_items))"
    )
    db.execute(
        "INSERT INTO temp.view_back SELECT id, conversation_id, status FROM items i "
        f"INDEXED BY items_gone WHERE dataset = ? AND gone = 1 AND {yielded}",
        (dataset,),
    )
    db.execute(
        "INSERT INTO temp.view_left SELECT id, conversation_id, status FROM items i "
        f"NOT INDEXED WHERE dataset = ? AND gone = 0 AND NOT {yielded}",
        (dataset,),
    )
    db.execute("UPDATE items SET gone = 0 WHERE id IN (SELECT id FROM temp.view_back)")
    db.execute("UPDATE items SET gone = 1 WHERE id IN (SELECT id FROM temp.view_left)")
    # Rows of the last complete read (stored before the mark) none of whose items is in view
    # any more, at the places that read found them; and rows this read found that it did
    # not have: stored since the mark, or back in view. A place in both is a changed row.
    (removed, added, changed) = db.execute(
        "WITH removed AS (SELECT c.row_index AS place FROM conversations c WHERE c.rowid <= "
        ":mark AND c.id IN (SELECT conversation_id FROM temp.view_left) AND c.id NOT IN "
        "(SELECT id FROM temp.read_rows)), "
        "added AS (SELECT r.row_index AS place FROM conversations c JOIN temp.read_rows r ON "
        "r.id = c.id WHERE c.rowid > :mark AND c.dataset = :dataset UNION ALL "
        "SELECT r.row_index FROM temp.read_rows r JOIN conversations c ON c.id = r.id "
        "WHERE c.rowid <= :mark AND r.id IN (SELECT conversation_id FROM temp.view_back)) "
        "SELECT (SELECT COUNT(*) FROM removed), (SELECT COUNT(*) FROM added), "
        "(SELECT COUNT(*) FROM (SELECT place FROM removed INTERSECT SELECT place FROM added))",
        {"mark": mark, "dataset": dataset},
    ).fetchone()
    (left_pending, left_answers) = db.execute(
        "SELECT COALESCE(SUM(status = 'pending'), 0), COALESCE(SUM(status = 'done'), 0) "
        "FROM temp.view_left"
    ).fetchone()
    (back_answers,) = db.execute(
        "SELECT COUNT(*) FROM temp.view_back WHERE status = 'done'"
    ).fetchone()
    return ViewChange(
        added=max(0, added - changed),
        removed=max(0, removed - changed),
        changed=changed,
        left_pending=left_pending,
        left_answers=left_answers,
        back_answers=back_answers,
    )
