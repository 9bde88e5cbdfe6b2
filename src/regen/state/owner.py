"""What every owner of some of state.db's tables gets from the Store: the connection, for
reads, and the Store's transaction, for writes."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

Tx = Callable[[], AbstractContextManager[sqlite3.Connection]]
Rows = list[tuple[Any, ...]]
"""Table rows, as executemany() takes them."""


class Owner:
    """Reads and writes of some of state.db's tables. Nobody else queries those tables; a
    write that must land with other owners' writes has a `*_in(db, ...)` form that runs inside
    the transaction the Store opens for them all."""

    def __init__(self, db: sqlite3.Connection, tx: Tx) -> None:
        self._db = db
        self._tx = tx
