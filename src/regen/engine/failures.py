"""How failed items end a run: too many of the recent ones failed (`ErrorRate`), or a client
error that the server gives every request of the job (`ClientErrorJudge`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from regen.config import RunConfig
from regen.conversation import Outcome
from regen.engine.client.errors import STOPS_RUN
from regen.engine.commits import CommitBuffer

if TYPE_CHECKING:
    from regen.engine.stats import RunStats

CLIENT_ERRORS = frozenset({"bad_request"})
"""Failures that may be the item's (a prompt too long) or the job's, when the server gives
them to every request (an unknown model, a refused field, filters that leave no provider):
see `ClientErrorJudge`."""
JOB_WIDE_AFTER = (3, 20)
"""Items in a row failing with the same client error, and nothing answered in between, that
may make it the job's error rather than theirs (`ClientErrorJudge`): before this run's first
answer, and after it (answers show that requests can succeed: only a long streak says that
something changed, a model withdrawn, say)..."""
JOB_WIDE_WAIT_S = 1.0
"""... once, this long later (or three of their latencies), no request sent before them is
still running: a healthy request would still be generating its answer."""


def _error_key(message: str | None) -> str:
    """An error message with its numbers blanked: the same error for every request."""
    return re.sub(r"\d+", "#", (message or "").lower())[:200]


class ErrorRate:
    """How the recent items ended, after their retries, and why those that failed did: the run
    stops when too many failed."""

    def __init__(self, stats: RunStats, run: RunConfig, stop: Callable[[str], None]) -> None:
        self._stats = stats
        """Its `recent_failures`: 1 for each recent item that failed, 0 for one that did not."""
        self._run = run
        self._stop = stop
        self._causes: deque[str | None] = deque(maxlen=200)
        """Why each of the recent items failed (None: it did not), beside recent_failures."""

    def count(self, *, failed: bool, cause: str | None = None) -> None:
        """Track how recent items ended, after their retries, and stop when too many failed.
        Items, not attempts: fast 5xx replies come back long before the first answers, so
        a provider that answers four requests in five once looked like one that answers none."""
        recent = self._stats.recent_failures
        recent.append(int(failed))
        self._causes.append(cause if failed else None)
        if len(recent) >= self._run.stop_error_min_attempts:
            rate = sum(recent) / len(recent)
            if rate > self._run.stop_error_rate:
                causes = Counter(c for c in self._causes if c is not None)
                commonest = f"; most often: {causes.most_common(1)[0][0]}" if causes else ""
                self._stop(
                    f"error rate {rate:.0%} over the last {len(recent)} items, after their "
                    f"retries (above [run].stop_error_rate = {self._run.stop_error_rate:g})"
                    f"{commonest}"
                )


class ClientErrorJudge:
    """A client error (400, 404, 422) may be the item's own (a prompt too long) or one the
    server gives every request of the job (an unknown model, a refused field). The item is
    recorded as failed, but not yet counted against the error rate: when the same error ends
    JOB_WIDE_AFTER items in a row, no answer comes in between, and after a while no request
    sent before them is still running (a healthy request would be, generating), the error is
    the job's: the run stops with the server's message, and those items go back to pending for
    the fixed job to send. An answer, or another error, ends the streak: its items failed on
    their own."""

    def __init__(
        self,
        stats: RunStats,
        commits: CommitBuffer,
        error_rate: ErrorRate,
        stop: Callable[[str], None],
    ) -> None:
        self._stats = stats
        self._commits = commits
        self._error_rate = error_rate
        self._stop = stop
        self._answered = 0
        self._suspects: list[Outcome] = []
        """The latest items that failed with the same client error, with no answer since."""
        self._suspect_key: str | None = None
        self._job_wide: str | None = None
        """The server's message, once a client error is known to be the job's."""

    def weigh(self, outcome: Outcome) -> tuple[Outcome, bool]:
        """An item's outcome as it is to be recorded, and whether it is a suspect (failed by a
        client error that may be the job's: it counts against the error rate once its streak
        ends). Once the error is known to be the job's, the items it fails stay pending; so
        do those an error that stops the run ended (a key refused, credit gone, a certificate
        or a redirect refused): it is the job's, said once as the run's stop, not each item's."""
        if outcome.failure_class in STOPS_RUN:
            return replace(outcome, failure_class=None, abandoned=True), False
        if outcome.failure_class in CLIENT_ERRORS:
            if self._job_wide is not None:  # the job's error: the item stays pending
                return replace(outcome, failure_class=None, abandoned=True), False
            return outcome, self._suspect(outcome)
        if outcome.result is not None:
            self._answered += 1
            self._clear_suspects()
        return outcome, False

    def _suspect(self, outcome: Outcome) -> bool:
        """Add the item to the streak of its client error (another error starts a new one);
        once the streak is long enough, the verdict comes after a while (`judge`)."""
        key = _error_key(outcome.failure_message)
        if self._suspects and key != self._suspect_key:
            self._clear_suspects()
        if not self._suspects:
            self._suspect_key = key
        self._suspects.append(outcome)
        if len(self._suspects) == self._streak_needed():
            latency = max(a.latency_s for o in self._suspects for a in o.attempts[-1:])
            wait_s = max(JOB_WIDE_WAIT_S, 3 * latency)
            since = time.monotonic()
            asyncio.get_running_loop().call_later(wait_s, self.judge, key, wait_s, since)
        return True

    def judge(self, key: str | None, wait_s: float, since: float = 0.0) -> None:
        """The verdict on a streak of one client error, `wait_s` after it reached its length
        at `since` (`_suspect`), or when every worker is done (key None: nothing runs any
        more). A request sent before `since` and still running got past the error (which
        comes back within a fraction of `wait_s`): the error is not every request's."""
        if self._job_wide is not None or len(self._suspects) < self._streak_needed():
            return
        if key is not None and key != self._suspect_key:
            return
        now = time.monotonic()
        oldest = min(
            (
                t0
                for lane in self._stats.lanes.values()
                for f in lane.flows.values()
                for t0 in f.on_wire.values()
            ),
            default=now,
        )
        if key is not None and oldest < since:  # one that passed the error's gate still runs
            asyncio.get_running_loop().call_later(wait_s, self.judge, key, wait_s, now)
            return
        suspects, self._suspects = self._suspects, []
        self._job_wide = suspects[-1].failure_message or "client error"
        for o in suspects:
            self._stats.datasets[o.dataset].failed -= 1
            self._commits.requeue(o.item_id)
        self._stop(
            f"every request fails with the same error: {self._job_wide} ({len(suspects)} "
            "items in a row, none answered and none still running; they stay pending: fix "
            "the job file and run again)"
        )

    def _streak_needed(self) -> int:
        return JOB_WIDE_AFTER[1 if self._answered else 0]

    def _clear_suspects(self) -> None:
        """The streak of one client error ended: its items failed on their own, and count
        against the error rate now."""
        suspects, self._suspects = self._suspects, []
        for o in suspects:
            self._error_rate.count(failed=True, cause=f"{o.failure_class}: {o.failure_message}")
