"""The commit buffer: what finished goes to state.db in groups, each complete in itself.

Outcomes of finished items, the bills of requests that were held or paid for and not used, the
requests that leave `outstanding` with them and the items that go back to pending are collected
here and committed together, one transaction for many, every tick of the scheduler's commit loop
(or sooner, when asked). A batch that cannot be written (a full disk) stays here and is tried
again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from regen import failpoints
from regen.conversation import Charge, Outcome
from regen.errors import StateError, StateGone
from regen.state.db import Store
from regen.state.outstanding import CutShort
from regen.state.work import PendingItem


class CommitBuffer:
    """What this run finished and has not committed yet, and how its commits went."""

    def __init__(
        self,
        store: Store,
        interval_s: float,
        *,
        stop: Callable[[str], None],
        gone: Callable[[StateGone], None],
    ) -> None:
        self._store = store
        self.interval_s = interval_s
        """How often the commit loop commits."""
        self._stop = stop
        self._gone = gone
        """Told when state.db is gone: nothing can be saved any more, and the run ends with
        that error."""
        self._pending: list[Outcome] = []
        self._charges: list[Charge] = []
        self._settled: list[int] = []
        """Requests leaving `outstanding` with the next commit: their bills are in it (or they
        ended unbilled)."""
        self._requeue: list[str] = []
        """Items recorded as failed by the job's own error, to be pending again."""
        self._cut: list[CutShort] = []
        """Attempts cut short on the wire, with how long they had run."""
        self._error: StateError | None = None
        self._recorded: Counter[str] = Counter()
        """Outcomes recorded per dataset (a sequential rescan waits for a new one)."""
        self._commits = 0
        """Successful commits so far (a claim made before the last one may be stale)."""
        self._committed = 0
        """Answers and failures this run has committed."""
        self._uncommitted: dict[str, str] = {}
        """Items of sequential datasets handed out whose outcome is not committed yet (id ->
        dataset): a rescan leaves them out. An outcome recorded but not yet committed still
        shows its item as pending in the store, so the item stays here until its commit (it
        once left at recording, and a rescan sent it again)."""

    def add(self, outcome: Outcome) -> None:
        """An item's outcome, for the next commit."""
        self._pending.append(outcome)
        self._recorded[outcome.dataset] += 1

    def charge(self, charge: Charge) -> None:
        """A bill for the ledger that no outcome carries (a held request's, or an answer paid
        for but not used)."""
        self._charges.append(charge)

    def settle(self, key: int) -> None:
        """A request that leaves `outstanding` with the next commit."""
        self._settled.append(key)

    def requeue(self, item_id: str) -> None:
        """An item recorded as failed that goes back to pending with the next commit."""
        self._requeue.append(item_id)

    def cut(self, cut: CutShort) -> None:
        """An attempt cut short on the wire (its answer's time is at least its elapsed time),
        for the next commit."""
        self._cut.append(cut)

    def handed_out(self, item: PendingItem) -> None:
        """An item of a sequential dataset was handed out: it is not pending for a rescan until
        its outcome is committed."""
        self._uncommitted[item.id] = item.dataset

    def uncommitted(self, item_id: str) -> bool:
        """The item was handed out and its outcome is not committed yet."""
        return item_id in self._uncommitted

    def in_flight(self, dataset: str) -> bool:
        """An item of the dataset was handed out and its outcome is not committed yet."""
        return any(ds == dataset for ds in self._uncommitted.values())

    def recorded(self, dataset: str) -> int:
        """Outcomes of the dataset recorded so far (committed or not)."""
        return self._recorded[dataset]

    @property
    def commits(self) -> int:
        """Successful commits so far."""
        return self._commits

    @property
    def unsaved(self) -> bool:
        """Outcomes wait to be committed (after a commit that failed, the store does not know
        them yet)."""
        return bool(self._pending)

    def flush(self) -> None:
        """Commit what finished, and the bills and requeued items that go with it."""
        # Group commit: one transaction for many finished items, each complete in itself. A
        # batch that cannot be written (a full disk) stays in memory and is tried again at each
        # tick while the run stops, so that space freed meanwhile saves it.
        if not (self._pending or self._charges or self._settled or self._requeue or self._cut):
            return
        batch, self._pending = self._pending, []
        charges, self._charges = self._charges, []
        settled, self._settled = self._settled, []
        requeue, self._requeue = self._requeue, []
        cut, self._cut = self._cut, []
        try:
            self._store.commit_outcomes(batch, charges, settled, requeue, cut)
            self._commits += 1
            self._committed += len(batch)
            failpoints.reached("commit", count=self._committed)
            for o in batch:
                self._uncommitted.pop(o.item_id, None)
        except StateError as exc:
            self._pending = batch + self._pending
            self._charges = charges + self._charges
            self._settled = settled + self._settled
            self._requeue = requeue + self._requeue
            self._cut = cut + self._cut
            if self._error is None:
                self._stop(f"cannot write state: {exc}")
            self._error = exc
            if isinstance(exc, StateGone):
                self._gone(exc)
        else:
            self._error = None

    async def loop(self) -> None:
        """Commit every `interval_s`, until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.flush()

    async def retry_unsaved(self, deadline: float) -> None:
        """Answers that could not be written (a full disk) are tried again until `deadline`
        (the end of the stop's grace period, by the monotonic clock): space freed meanwhile
        saves them."""
        while (
            self._error is not None
            and not isinstance(self._error, StateGone)
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(self.interval_s)
            self.flush()

    def raise_unsaved(self) -> None:
        """Raise the last commit's error when what finished could not all be saved."""
        if isinstance(self._error, StateGone):
            raise self._error
        if self._error is not None:
            lost = sum(1 for o in self._pending if not o.abandoned)
            raise StateError(
                f"{self._error}; {lost} finished answers could not be saved and will be "
                "sent again by the next run; every earlier result is kept"
            )
