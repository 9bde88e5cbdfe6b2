"""The datasets' sources as last read: their order, files, fingerprints and bad rows
(tables `datasets`, `bad_rows`; meta `source_fingerprint <dataset>`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from regen.conversation import BadRow
from regen.state.owner import Owner


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


KEPT_BAD_ROWS = 10_000
"""Bad rows kept per dataset, the first read (datasets.bad_rows counts them all). Enough to
show every kind of problem a file has, with row numbers to find each by; a file of nothing
but garbage would otherwise store a record for each of its lines (4.2M lines made a 499 MB
state.db). 10,000 records are about 1 MB."""
KEPT_BAD_ROWS_READ = KEPT_BAD_ROWS + 5
"""Bad rows a reader needs to hold for record_read: those kept, and the first row numbers past
them (what the group of rows not kept shows)."""
NOT_KEPT_KEY = "bad_rows_not_kept"
"""meta `bad_rows_not_kept <dataset>`: the first row numbers past the bad rows kept."""


class Sources(Owner):
    """The `datasets` and `bad_rows` tables."""

    def register(self, name: str, position: int, source: str, mode: str | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO datasets (name, position, source) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
                "source = excluded.source",
                (name, position, source),
            )
            if mode is not None:
                db.execute("UPDATE datasets SET mode = ? WHERE name = ?", (mode, name))

    def mode(self, dataset: str) -> str | None:
        """The mode the dataset's turns were chosen by (None: read before it was recorded)."""
        row = self._db.execute("SELECT mode FROM datasets WHERE name = ?", (dataset,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def read_before(self, dataset: str) -> bool:
        """Whether the dataset had a complete read with rows in it (record_read)."""
        row = self._db.execute(
            "SELECT rows_read FROM datasets WHERE name = ?", (dataset,)
        ).fetchone()
        return row is not None and row[0] > 0

    def fingerprint(self, dataset: str) -> str | None:
        """The fingerprint recorded with the dataset's last complete read (record_read)."""
        row = self._db.execute(
            "SELECT value FROM meta WHERE key = ?", (f"source_fingerprint {dataset}",)
        ).fetchone()
        return None if row is None else str(row[0])

    def record_read(
        self,
        dataset: str,
        rows_read: int,
        turns_read: int,
        bad: list[BadRow],
        skipped: int = 0,
        fmt: str | None = None,
        fingerprint: str | None = None,
        notes: Sequence[BadRow] = (),
        bad_total: int | None = None,
    ) -> None:
        """Replace the dataset's bad-row report and row notes with this read's, and record the
        source's fingerprint (None: none is known, so the next run reads the source again).
        Of the bad rows the first KEPT_BAD_ROWS are stored, and the count of all: `bad_total`,
        when the reader kept only the first of them in `bad` (KEPT_BAD_ROWS_READ are enough),
        or else len(bad)."""
        with self._tx() as db:
            db.execute("DELETE FROM bad_rows WHERE dataset = ?", (dataset,))
            db.executemany(
                "INSERT OR REPLACE INTO bad_rows VALUES (?, ?, ?)",
                [(b.dataset, b.row_index, b.reason) for b in bad[:KEPT_BAD_ROWS]],
            )
            past = [b.row_index for b in bad[KEPT_BAD_ROWS:KEPT_BAD_ROWS_READ]]
            if past:
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    (f"{NOT_KEPT_KEY} {dataset}", json.dumps(past)),
                )
            else:
                db.execute("DELETE FROM meta WHERE key = ?", (f"{NOT_KEPT_KEY} {dataset}",))
            db.execute("DELETE FROM row_notes WHERE dataset = ?", (dataset,))
            db.executemany(
                "INSERT OR IGNORE INTO row_notes VALUES (?, ?, ?)",
                [(b.dataset, b.row_index, b.reason) for b in notes],
            )
            db.execute(
                "UPDATE datasets SET rows_read = ?, turns_read = ?, bad_rows = ?, "
                "skipped_rows = ?, format = COALESCE(?, format) WHERE name = ?",
                (rows_read, turns_read, max(len(bad), bad_total or 0), skipped, fmt, dataset),
            )
            key = f"source_fingerprint {dataset}"
            if fingerprint is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, fingerprint))

    def source(self, dataset: str) -> str:
        row = self._db.execute("SELECT source FROM datasets WHERE name = ?", (dataset,)).fetchone()
        return str(row[0]) if row else "?"

    def bad_rows(self, dataset: str | None = None, limit: int = 10) -> list[BadRow]:
        """The first bad rows (of a dataset, or of all), in row order, of those kept (the first
        KEPT_BAD_ROWS of each dataset; datasets.bad_rows counts them all)."""
        where, args = ("WHERE dataset = ? ", (dataset,)) if dataset else ("", ())
        rows = self._db.execute(
            f"SELECT b.dataset, b.row_index, b.reason FROM bad_rows b {where}"
            "ORDER BY (SELECT position FROM datasets d WHERE d.name = b.dataset), row_index "
            "LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [BadRow(*r) for r in rows]

    def bad_row_reasons(self, limit: int = 5, table: str = "bad_rows") -> list[BadRowGroup]:
        """The commonest bad-row reasons per dataset: rows whose reasons differ only in their
        numbers (or their parenthesized details) are one group, shown by its first row's own
        reason and its first rows. `table = "row_notes"`: the same for the notes on rows
        used (what modes.row_notes noticed).

        A dataset with more bad rows than were kept has one more group: the rows past the first
        KEPT_BAD_ROWS, whose reasons were not kept, and the dataset's true total."""
        groups: dict[tuple[str, str], BadRowGroup] = {}
        column = {"bad_rows": "reason", "row_notes": "note"}[table]
        kept: dict[str, int] = {}
        for ds, row, reason, source in self._db.execute(
            f"SELECT b.dataset, b.row_index, b.{column}, d.source FROM {table} b "
            "LEFT JOIN datasets d ON d.name = b.dataset ORDER BY b.dataset, b.row_index"
        ):
            key = (ds, re.sub(r"\([^)]*\)|\d+", "N", reason))
            g = groups.get(key)
            if g is None:
                g = groups[key] = BadRowGroup(ds, source or "?", reason[:200], 0, [])
            g.rows += 1
            kept[ds] = kept.get(ds, 0) + 1
            if len(g.first_rows) < 5:
                g.first_rows.append(row)
        if table == "bad_rows":
            for ds, source, total, past in self._db.execute(
                "SELECT d.name, d.source, d.bad_rows, m.value FROM datasets d "
                "LEFT JOIN meta m ON m.key = ? || ' ' || d.name",
                (NOT_KEPT_KEY,),
            ):
                n = kept.get(ds, 0)
                if total > n:
                    groups[(ds, "")] = BadRowGroup(
                        ds,
                        source,
                        f"reasons not kept: {total:,} rows not used in all, the first {n:,} "
                        "kept with their reasons",
                        total - n,
                        _row_numbers(past),
                    )
        return sorted(groups.values(), key=lambda g: -g.rows)[:limit]


def _row_numbers(text: str | None) -> list[int]:
    """Row numbers stored as a JSON list (none, if what is stored is not one)."""
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [n for n in value if type(n) is int] if isinstance(value, list) else []
