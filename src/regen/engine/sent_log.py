"""The record of requests sent: rows of `outstanding` written before a request that may be billed
after its client is gone goes out, and the generation ids that the responses name, written as
soon as they come.

A run killed at any moment leaves in state.db every request that may have been billed, and the
id to look its bill up by once the response named one. Writes are grouped: one transaction for
every request admitted meanwhile, at most every SENT_WRITE_EVERY_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from regen.engine.budget import Lease
from regen.engine.holds import DEADLINE_GRACE_S
from regen.errors import StateError, StateGone
from regen.state.db import Store
from regen.state.outstanding import SEQUENCE_BITS, Sent
from regen.state.work import PendingItem

SENT_WRITE_EVERY_S = 0.025
"""Requests about to be sent are written to `outstanding` together, at most this often..."""
IDENTIFY_WRITE_EVERY_S = 0.01
"""... and their generation ids, as the responses name them, at most this often."""


class SentLog:
    """This run's requests about to be sent and generation ids learnt, not yet in state.db,
    and the one write of them that is due."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        *,
        stop: Callable[[str], None],
        gone: Callable[[StateGone], None],
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._stop = stop
        self._gone = gone
        """Told when state.db is gone: nothing can be saved any more, and the run ends with
        that error."""
        self._seq = 0
        self._to_write: list[Sent] = []
        self._to_identify: list[tuple[int, str]] = []
        self._writing: asyncio.Future[bool] | None = None
        self._last_write = self._write_due = 0.0

    def sent(
        self, lease: Lease, item: PendingItem, *, lane: str, endpoint: str, total_s: float
    ) -> Sent:
        """Queue the record of a request about to be sent to `endpoint` from `lane`, whose
        requests take at most `total_s` (`record` writes it)."""
        self._seq += 1
        now = time.time()
        sent = Sent(
            (self._run_id << SEQUENCE_BITS) | self._seq,
            self._run_id,
            item.id,
            item.dataset,
            lane,
            endpoint,
            lease.worst_usd,
            lease.tokens,
            now,
            now + total_s + DEADLINE_GRACE_S,
        )
        self._to_write.append(sent)
        return sent

    def identifier(self, key: int) -> Callable[[str], None]:
        """What the client calls with a request's generation id as soon as the response names
        it: written at once, so that a kill from then on leaves the id to look its bill up."""

        def identified(generation_id: str) -> None:
            self._to_identify.append((key, generation_id))
            self._schedule_write(IDENTIFY_WRITE_EVERY_S)

        return identified

    async def record(self) -> bool:
        """Wait until the requests queued to be sent are in state.db (one transaction for all
        that queued meanwhile). False: it cannot be written, and they must not be sent."""
        return await self._schedule_write(SENT_WRITE_EVERY_S)

    def _schedule_write(self, every_s: float) -> asyncio.Future[bool]:
        """The next write of `outstanding`, no later than `every_s` after the last one. Every
        admission until then joins it: one transaction every SENT_WRITE_EVERY_S at most (a few
        milliseconds before a request that takes seconds), rather than one per turn of the
        loop, which cost a sixth of a run's CPU. Generation ids go sooner (they delay nothing,
        and one not yet written when the run is killed leaves its bill to be guessed)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = max(now, self._last_write + every_s)
        if self._writing is None:
            self._writing = loop.create_future()
        elif due >= self._write_due:
            return self._writing
        self._write_due = due
        loop.call_later(due - now, self._write)
        return self._writing

    def _write(self) -> None:
        if self._writing is None:  # a later timer of a write already made
            return
        self._last_write = asyncio.get_running_loop().time()
        done, self._writing = self._writing, None
        sent, self._to_write = self._to_write, []
        identified, self._to_identify = self._to_identify, []
        ok = True
        try:
            self._store.outstanding.write(sent, identified)
        except StateError as exc:
            ok = False
            self._stop(f"cannot write state: {exc}")
            if isinstance(exc, StateGone):
                self._gone(exc)
        if done is not None and not done.done():
            done.set_result(ok)
