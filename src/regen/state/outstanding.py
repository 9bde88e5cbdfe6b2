"""state.db's `outstanding` table: every request sent whose bill is not yet in the ledger.

A provider such as OpenRouter bills an answer when its generation ends, after a client that
was killed is gone. So each request that can be billed is written here before it is sent, with
what it may cost and the scopes it belongs to (dataset, lane), its generation id as soon as the
response names one, and it leaves in the same transaction that writes its bill to the ledger
(or once it ended unbilled). Whatever a run leaves here is what the next run holds against
every budget and cap, request by request, until each bill is known. This module owns the
table's reads and writes; `Store` opens the file and hands it out.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from regen.state.owner import Owner

SEQUENCE_BITS = 32
"""A row's id is (run id << SEQUENCE_BITS) | its number within the run: known before it is
written, so that later updates and deletes can name it."""


def m009_outstanding(db: sqlite3.Connection) -> None:
    """Requests sent whose bill is not in the ledger yet (see this module). A state from an
    older regen kept one number instead, `exposure_usd` in meta: what a killed run's requests
    might still cost, held for the whole job. It becomes one row of no dataset, held until its
    time is up, then released without a charge (the reconciliation shows what was billed)."""
    db.execute(
        """
        CREATE TABLE outstanding (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL,
            item_id TEXT NOT NULL,
            dataset TEXT,
            lane TEXT,
            endpoint TEXT,
            worst_usd REAL NOT NULL,
            tokens REAL NOT NULL,
            sent_at REAL NOT NULL,
            deadline REAL NOT NULL,
            generation_id TEXT
        )
        """
    )
    row = db.execute("SELECT value FROM meta WHERE key = 'exposure_usd'").fetchone()
    if row is None:
        return
    try:
        data = json.loads(row[0])
    except ValueError:
        data = {}
    at = float(data.get("at") or 0.0)
    legacy = [(float(h.get("usd", 0.0)), float(h.get("until", at))) for h in data.get("holds", [])]
    # Its own exposure was held for a lane timeout from the next start; an hour stands in.
    legacy.append((float(data.get("usd") or 0.0), at + 3600.0))
    for n, (usd, until) in enumerate(legacy):
        if usd > 1e-12:
            db.execute(
                "INSERT INTO outstanding (id, run_id, item_id, worst_usd, tokens, sent_at, "
                "deadline) VALUES (?, 0, '', ?, 0, ?, ?)",
                (n + 1, usd, at, until),
            )
    db.execute("DELETE FROM meta WHERE key = 'exposure_usd'")


def m017_cut_short(db: sqlite3.Connection) -> None:
    """Attempts cut short while on the wire (abandoned at a stop's end, a pilot's time bound):
    how long each had run. An answer still running then lasts at least that long, a censored
    time the forecast and the ETA count (a killed run's requests are in `outstanding`)."""
    db.execute(
        """
        CREATE TABLE cut_short (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL,
            item_id TEXT NOT NULL,
            dataset TEXT NOT NULL,
            lane TEXT NOT NULL,
            elapsed_s REAL NOT NULL
        )
        """
    )


@dataclass(frozen=True, slots=True)
class CutShort:
    """An attempt cut short on the wire: its run, item, dataset and lane, and how long it had
    run (a lower bound on its answer's time)."""

    run_id: int
    item_id: str
    dataset: str
    lane: str
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class Sent:
    """One request that may be billed: what it may cost, and where that counts."""

    id: int
    run_id: int
    item_id: str
    dataset: str | None
    """None: held for the whole job only (a state from before m009)."""
    lane: str | None
    endpoint: str | None
    worst_usd: float
    """The most it can cost: held against the dollar caps."""
    tokens: float
    """What it is expected to use: held against its dataset's token budget."""
    sent_at: float
    deadline: float
    """Wall clock time after which a bill that was not found is counted at what the account's
    unexplained spend allows (the request is surely over by then)."""
    generation_id: str | None = None


_COLUMNS = (
    "id, run_id, item_id, dataset, lane, endpoint, worst_usd, tokens, sent_at, deadline, "
    "generation_id"
)


class Outstanding(Owner):
    """Reads and writes of the `outstanding` table, inside Store's transactions."""

    def write(
        self,
        sent: Iterable[Sent],
        identified: Iterable[tuple[int, str]] = (),
        ended: Iterable[int] = (),
    ) -> None:
        """In one transaction: record requests about to be sent, the generation ids learnt,
        and requests that ended without a bill (an error status, or never sent)."""
        with self._tx() as db:
            self.write_in(db, sent, identified, ended)

    @staticmethod
    def write_in(
        db: sqlite3.Connection,
        sent: Iterable[Sent],
        identified: Iterable[tuple[int, str]] = (),
        ended: Iterable[int] = (),
    ) -> None:
        """The same, inside a transaction someone else holds (a commit of outcomes, whose
        bills must leave this table in the transaction that writes them to the ledger)."""
        db.executemany(
            f"INSERT INTO outstanding ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    s.id,
                    s.run_id,
                    s.item_id,
                    s.dataset,
                    s.lane,
                    s.endpoint,
                    s.worst_usd,
                    s.tokens,
                    s.sent_at,
                    s.deadline,
                    s.generation_id,
                )
                for s in sent
            ],
        )
        db.executemany(
            "UPDATE outstanding SET generation_id = ? WHERE id = ?",
            [(gen, key) for key, gen in identified],
        )
        db.executemany("DELETE FROM outstanding WHERE id = ?", [(key,) for key in ended])

    def all(self) -> list[Sent]:
        """Every request whose bill is not in the ledger, oldest first."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM outstanding ORDER BY id").fetchall()
        return [Sent(*r) for r in rows]

    def held(self, live_run: int | None = None) -> tuple[int, float, float | None]:
        """Requests of runs other than `live_run` whose bills are not known: how many, their
        worst cases in dollars, and the latest deadline (None when there are none)."""
        n, usd, until = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(worst_usd), 0.0), MAX(deadline) FROM outstanding "
            "WHERE run_id IS NOT ?",
            (live_run,),
        ).fetchone()
        return int(n), float(usd), None if until is None else float(until)

    @staticmethod
    def record_cut_in(db: sqlite3.Connection, cut: Iterable[CutShort]) -> None:
        """Attempts cut short on the wire, inside a transaction someone else holds."""
        rows = list(cut)
        if not rows:  # nothing to write: a state.db from before m017 is not touched
            return
        db.executemany(
            "INSERT INTO cut_short (run_id, item_id, dataset, lane, elapsed_s) VALUES (?,?,?,?,?)",
            [(c.run_id, c.item_id, c.dataset, c.lane, c.elapsed_s) for c in rows],
        )

    def cut_short(self) -> dict[tuple[str, str], list[float]]:
        """Per (lane, dataset), times known only as lower bounds: how long each attempt cut
        short on the wire had run (`cut_short`), and each request an earlier run left here had
        been on the wire when that run ended (a killed run: at its last timeline point). One
        per item and lane, the longest, and none for an item since answered in that lane (its
        time is known). The ETA and the plan count them as answers lasting at least that."""
        out: dict[tuple[str, str], list[float]] = {}
        for lane, ds, age in self._db.execute(_CENSORED):
            if age is not None and age > 0:
                out.setdefault((lane, ds), []).append(float(age))
        return out


_CENSORED = """
WITH cut AS (
    SELECT run_id, item_id, lane, dataset, elapsed_s AS age FROM cut_short
    UNION ALL
    SELECT o.run_id, o.item_id, o.lane, o.dataset,
           COALESCE(r.ended_at, (SELECT MAX(t) FROM timeline WHERE run_id = o.run_id))
           - o.sent_at
    FROM outstanding o JOIN runs r ON r.id = o.run_id
    WHERE o.lane IS NOT NULL AND o.dataset IS NOT NULL
      -- a request cut at a stop is in both: its time on the wire is the one measured
      AND NOT EXISTS (SELECT 1 FROM cut_short c WHERE c.run_id = o.run_id
                      AND c.item_id = o.item_id AND c.lane = o.lane)
)
SELECT cut.lane, cut.dataset, MAX(cut.age) FROM cut
WHERE NOT EXISTS (
    SELECT 1 FROM attempts a JOIN items i ON i.id = a.item_id
    WHERE a.item_id = cut.item_id AND COALESCE(a.lane, i.lane) = cut.lane
      AND a.failure_class IS NULL
)
GROUP BY cut.item_id, cut.lane
"""
