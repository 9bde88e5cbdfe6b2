"""state.db: the file, its one connection and its migrations, and the owners of its tables.

Nobody else opens state.db. Writes that belong together (a result, its attempts and its ledger
charge) happen in one transaction, so a crash at any moment leaves either all of them or none.
Every text bound for it passes one gate, the connection's (`KeyFreeConnection`): a key a server
echoed into an error, a provider's name or an answer is never stored, whichever owner writes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from regen.conversation import Charge, Outcome
from regen.errors import StateError, StateGone
from regen.safe import confined, has_key, holds_keys, redact
from regen.state.answers import Answers
from regen.state.outcomes import outcome_rows, with_cache_use
from regen.state.outstanding import CutShort, Outstanding
from regen.state.runs import Runs
from regen.state.schema import (
    MIGRATIONS,
    Recorded,
    records,
    refuse_unknown_schema,
    stored_version,
)
from regen.state.sources import Sources
from regen.state.spend import Spend
from regen.state.work import Work

STATE_FILE = "state.db"
STATE_FILES = (STATE_FILE, f"{STATE_FILE}-wal", f"{STATE_FILE}-shm", f"{STATE_FILE}-journal")
"""The database and the files SQLite keeps beside it (a reader writes the -shm too)."""


def _key_free(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


def _key_free_row(params: Any) -> Any:
    if not holds_keys():
        return params
    if isinstance(params, Mapping):
        return {k: _key_free(v) for k, v in params.items()}
    # Rows are copied only when one holds a key: ingest writes millions of them.
    for value in params:
        if isinstance(value, str) and has_key(value):
            return tuple(_key_free(v) for v in params)
    return params


def _key_free_rows(rows: Any) -> Any:
    return (_key_free_row(p) for p in rows) if holds_keys() else rows


class _KeyFreeCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        return super().execute(sql, _key_free_row(parameters))

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Self:
        return super().executemany(sql, _key_free_rows(seq_of_parameters))


class KeyFreeConnection(sqlite3.Connection):
    """state.db's connection: every text parameter of every statement has the registered keys
    taken out, so no owner's write (a stop reason, a failure message, a provider's name, an
    answer, a dataset's row) can store one. Blobs (token ids) are left as they are."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return super().execute(sql, _key_free_row(parameters))

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        return super().executemany(sql, _key_free_rows(seq_of_parameters))

    def cursor(self, factory: Any = _KeyFreeCursor) -> Any:
        return super().cursor(factory)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def storage_hint(exc: sqlite3.Error) -> str:
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


def _state_path(out_dir: Path) -> Path:
    """`<out_dir>/state.db`, once it and the files SQLite writes beside it (a reader too: the
    -shm) are known not to lead out of the directory (safe.confined)."""
    for name in STATE_FILES:
        confined(out_dir, out_dir / name)
    return out_dir / STATE_FILE


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


class Store:
    """A job's state.db. Open with Store.open(out_dir)."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._identity = _identity(path)
        """The file opened (device, inode): each write checks it is still the one there."""
        self.work = Work(db, self._tx)
        """Conversations and their items: what there is to send, and its status."""
        self.answers = Answers(db, self._tx)
        """Each done item's answer."""
        self.spend = Spend(db, self._tx)
        """Every attempt and every charge."""
        self.outstanding = Outstanding(db, self._tx)
        """Requests sent whose bill is not in the ledger yet."""
        self.runs = Runs(db, self._tx)
        """The job's runs and their timeline."""
        self.sources = Sources(db, self._tx)
        """The datasets' sources as last read, and their bad rows."""

    @classmethod
    def open(cls, out_dir: Path) -> Store:
        """Open (creating if needed) `<out_dir>/state.db` and apply pending migrations. A
        state.db of a newer regen is refused before anything is written to it."""
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"{out_dir}: cannot create output directory: {exc}") from exc
        refuse_lost_state(out_dir)
        path = _state_path(out_dir)
        try:
            db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, factory=KeyFreeConnection
            )
            try:
                refuse_unknown_schema(db, path)
            except StateError:
                db.close()
                raise
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA busy_timeout=10000")
            store = cls(db, path)
            store._migrate()
            store.work.build_deferred_indexes()
        except sqlite3.Error as exc:
            raise StateError(
                f"{path}: cannot open state database: {exc}{storage_hint(exc)}"
            ) from exc
        return store

    @classmethod
    def open_readonly(cls, out_dir: Path) -> Store:
        """Open `<out_dir>/state.db` for reading only, as `regen status` does while a run may
        be writing it (WAL lets readers and the writer work at once). Nothing is migrated."""
        path = _state_path(out_dir)
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
            try:
                refuse_unknown_schema(store._db, path)
            except StateError:
                store.close()
                raise
        except sqlite3.Error as exc:
            raise StateError(
                f"{path}: cannot read state database: {exc}{storage_hint(exc)}"
            ) from exc
        return store

    @classmethod
    def _connect_readonly(cls, path: Path, *, immutable: bool) -> Store:
        uri = f"file:{path}?mode=ro" + ("&immutable=1" if immutable else "")
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=KeyFreeConnection)
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
            raise StateError(f"{self.path}: write failed: {exc}{storage_hint(exc)}") from exc

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
        return stored_version(self._db)

    def records(self, what: Recorded) -> bool:
        """Whether this state.db is new enough to hold `what` (an older one, opened read-only
        by `regen status` or a report, simply lacks it)."""
        return records(self._db, what)

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def commit_outcomes(
        self,
        outcomes: Iterable[Outcome],
        charges: Iterable[Charge] = (),
        settled: Iterable[int] = (),
        requeued: Iterable[str] = (),
        cut: Iterable[CutShort] = (),
    ) -> None:
        """Commit finished items (each one's result or failure, attempts and ledger charge) and
        charges learnt after the fact (`Charge.kind`), in one transaction, with the requests
        whose bills these are leaving `outstanding` (`settled`: their ids) in it too.
        `requeued`: items recorded as failed (in this batch or before) that are pending again
        (their error was the job's, not theirs). `cut`: attempts cut short on the wire."""
        outcomes, charges = list(outcomes), list(charges)
        rows = outcome_rows(outcomes, charges, time.time())
        # Cache use has columns since m015 (a test may write a state.db of an older schema).
        cache = self.records("cache_use")
        if cache:
            rows = with_cache_use(rows, outcomes, charges)
        with self._tx() as db:
            Spend.record_in(db, rows.attempts, rows.ledger, cache_use=cache)
            Answers.insert_in(db, rows.results, cache_use=cache)
            Work.finish_in(db, rows, requeued)
            Outstanding.write_in(db, (), (), settled)
            Outstanding.record_cut_in(db, cut)
