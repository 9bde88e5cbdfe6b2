"""The datasets' sources as last read: their order, files, fingerprints and bad rows
(tables `datasets`, `bad_rows`; meta `source_fingerprint <dataset>`)."""

from __future__ import annotations

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
    ) -> None:
        """Replace the dataset's bad-row report and row notes with this read's, and record the
        source's fingerprint (None: none is known, so the next run reads the source again)."""
        with self._tx() as db:
            db.execute("DELETE FROM bad_rows WHERE dataset = ?", (dataset,))
            db.executemany(
                "INSERT OR REPLACE INTO bad_rows VALUES (?, ?, ?)",
                [(b.dataset, b.row_index, b.reason) for b in bad],
            )
            db.execute("DELETE FROM row_notes WHERE dataset = ?", (dataset,))
            db.executemany(
                "INSERT OR IGNORE INTO row_notes VALUES (?, ?, ?)",
                [(b.dataset, b.row_index, b.reason) for b in notes],
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

    def source(self, dataset: str) -> str:
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

    def bad_row_reasons(self, limit: int = 5, table: str = "bad_rows") -> list[BadRowGroup]:
        """The commonest bad-row reasons per dataset: rows whose reasons differ only in their
        numbers (or their parenthesized details) are one group, shown by its first row's own
        reason and its first rows. `table = "row_notes"`: the same for the notes on rows
        used (what modes.row_notes noticed)."""
        groups: dict[tuple[str, str], BadRowGroup] = {}
        column = {"bad_rows": "reason", "row_notes": "note"}[table]
        for ds, row, reason, source in self._db.execute(
            f"SELECT b.dataset, b.row_index, b.{column}, d.source FROM {table} b "
            "LEFT JOIN datasets d ON d.name = b.dataset ORDER BY b.dataset, b.row_index"
        ):
            key = (ds, re.sub(r"\([^)]*\)|\d+", "N", reason))
            g = groups.get(key)
            if g is None:
                g = groups[key] = BadRowGroup(ds, source or "?", reason[:200], 0, [])
            g.rows += 1
            if len(g.first_rows) < 5:
                g.first_rows.append(row)
        return sorted(groups.values(), key=lambda g: -g.rows)[:limit]
