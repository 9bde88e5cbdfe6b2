"""Holds: requests that may have been billed and whose bills are not known yet.

A request whose answer never came back whole (one of a killed run, which OpenRouter still
bills when its generation ends; or one of this run cut short by a timeout or a dropped
connection) may cost up to its worst case. It is held against every scope it belongs to
(`BudgetBook.add_hold` / `hold`) until its bill is known, and the bill is counted in its place:

- with its generation id (recorded in `outstanding` as soon as the response named it), by
  reading `/generation?id=` until the record is there (it lags the answer by a few seconds);
- without one, or when no record comes, at its deadline (a lane timeout and a minute after it
  was sent: the request is over by then), at what the account's spend beyond the ledger
  allows, and never more than its worst case. A key that is the job's own makes that exact;
  on a shared key it is the worst case, since other use of the key cannot be told apart.

Requests to servers that stop generating when their client goes (vLLM, SGLang) are released
at once: nothing is billed after a kill there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from regen.conversation import Charge, Usage
from regen.engine.budget import BudgetBook, Prices, fill_cost
from regen.engine.client.account import JsonGetter, generation_charge
from regen.engine.gate import Asked, Gate
from regen.state.outstanding import Sent

LOOKUP_WAITS_S = (1.0, 1.0, 2.0, 4.0, 8.0)
"""When to read a generation's bill after its request ended (its record lags the answer),
then every LOOKUP_EVERY_S until the deadline."""
LOOKUP_EVERY_S = 15.0
DEADLINE_GRACE_S = 60.0
"""A request is surely over this long after its lane's timeout (and its bill recorded)."""


@dataclass
class Held:
    """One held request and when to look for its bill next."""

    sent: Sent
    earlier_run: bool
    """Sent by a run that ended (killed, or stopped before its bill came)."""
    next_lookup: float = 0.0
    lookups: int = 0


@dataclass(frozen=True, slots=True)
class HoldSummary:
    """What is held, for the live view, the metrics and the ETA."""

    requests: int = 0
    usd: float = 0.0
    earlier_requests: int = 0
    """Of them, requests of runs that ended (killed)."""
    earlier_usd: float = 0.0
    until: float | None = None
    """The latest deadline (wall clock): nothing is held after it."""

    def line(self) -> str:
        """How a person reads it."""
        if not self.requests:
            return ""
        whose = (
            # An earlier run may have been killed or stopped (a Ctrl-C'd pilot) before its
            # bills came: which one is the runs table's to say (`regen status`).
            "of an earlier run"
            if self.earlier_requests == self.requests
            else "cut short in this run or an earlier one"
        )
        until = time.strftime("%H:%M:%S", time.localtime(self.until)) if self.until else "-"
        return (
            f"waiting for the bills of {self.requests} requests {whose}: up to "
            f"${self.usd:.4f}, released as they arrive (by {until} at the latest)"
        )


@dataclass
class HoldKeeper:
    """Finds the bills of held requests and counts each in place of its hold."""

    book: BudgetBook
    lookup: Mapping[str, JsonGetter]
    """A client that reads `/generation` for each endpoint that has one (OpenRouter)."""
    prices: Mapping[str, Prices | None]
    account_of: Mapping[str, str]
    """Each billing endpoint's account key (endpoints of one base URL and key variable)."""
    unexplained: Callable[[], Awaitable[dict[str, float]]]
    """Per account: what the provider billed since the job started beyond the ledger."""
    settle: Callable[[Charge | None, int], None]
    """Commit a bill (None: nothing billed) and take the request out of `outstanding`, in one
    transaction (the scheduler's next commit)."""
    flush: Callable[[], None]
    """Commit what is waiting, so that the ledger is current before the account is read."""
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    held: dict[int, Held] = field(default_factory=dict)
    released_unverified: float = 0.0
    """Dollars counted for requests whose bills never showed (`kind = 'unverified'`)."""
    found: int = 0
    """Bills found by generation id."""
    key_limits: bool = False
    """The job runs on a key made for it, whose credit limit is raised by what is freed."""
    freed_earlier_usd: float = 0.0
    """What requests of earlier runs turned out not to cost of their worst cases: room the
    job may spend again (a key made for this run gets it added to its limit). Negative parts
    are bills above their worst cases (prices gone stale), which the key's limit loses."""
    gate: Gate | None = None
    """Judges each bill found (`engine/gate.py`); None: believed as it is (tests)."""
    max_tokens: Mapping[str, int] = field(default_factory=dict)
    """Each lane's max_tokens: what a held request of the lane may have written."""
    lagging_usd: float = 0.0
    """The room freed so far that the run's key's limit must get before the job spends it
    (the positive parts of `freed_earlier_usd`)."""

    def load(self, rows: Iterable[Sent], billed_after_gone: Callable[[str | None], bool]) -> int:
        """Hold the requests earlier runs left outstanding. Those to servers that bill nothing
        once the client is gone are released at once. Returns how many are held."""
        for s in rows:
            if not billed_after_gone(s.endpoint):
                self.settle(None, s.id)
                self._free(s.worst_usd)
                continue
            self.book.add_hold(s.dataset, s.worst_usd, s.tokens, awaited=bool(s.generation_id))
            self.held[s.id] = Held(s, earlier_run=True)
        return len(self.held)

    def _free(self, usd: float) -> None:
        self.freed_earlier_usd += usd
        if usd > 0:
            self.lagging_usd += usd
            if self.key_limits:  # not the job's to spend until the run's key says so too
                self.book.key_lag_usd += usd

    def add(self, sent: Sent) -> None:
        """A request of this run that ended without its bill (its lease is already held)."""
        now = self.clock()
        self.held[sent.id] = Held(sent, earlier_run=False, next_lookup=now + LOOKUP_WAITS_S[0])

    def summary(self) -> HoldSummary:
        if not self.held:
            return HoldSummary()
        earlier = [h.sent for h in self.held.values() if h.earlier_run]
        return HoldSummary(
            len(self.held),
            sum(h.sent.worst_usd for h in self.held.values()),
            len(earlier),
            sum(s.worst_usd for s in earlier),
            max(h.sent.deadline for h in self.held.values()),
        )

    async def run(self, every_s: float = 0.5) -> None:
        """Until cancelled: look up what is due, and release what is past its deadline."""
        while True:
            await self.step()
            await self.sleep(every_s)

    async def settle_all(self, timeout_s: float, every_s: float = 0.5) -> None:
        """At the end of a run: keep looking for this run's bills for up to `timeout_s`.
        What is still held then stays in `outstanding` for the next run."""
        deadline = self.clock() + timeout_s
        while any(not h.earlier_run for h in self.held.values()) and self.clock() < deadline:
            await self.step()
            await self.sleep(every_s)

    async def step(self) -> None:
        now = self.clock()
        due = [h for h in self.held.values() if h.sent.generation_id and h.next_lookup <= now]
        for h in due:
            if h.sent.id not in self.held:
                continue
            await self._look_up(h)
        now = self.clock()
        expired = [h for h in self.held.values() if h.sent.deadline <= now]
        if any(h.sent.generation_id is None for h in expired) and any(
            h.sent.generation_id is not None and h.sent.deadline > now for h in self.held.values()
        ):
            # The account's spend beyond the ledger also holds the bills still to be found by
            # their ids: counted first, they leave the rest to the requests without one.
            expired = [h for h in expired if h.sent.generation_id is not None]
        if expired:
            await self._expire(expired)

    async def _look_up(self, h: Held) -> None:
        s = h.sent
        client = self.lookup.get(s.endpoint or "") or next(iter(self.lookup.values()), None)
        if client is None or s.generation_id is None:
            h.next_lookup = s.deadline
            return
        found = await generation_charge(client, s.generation_id)
        h.lookups += 1
        wait = LOOKUP_WAITS_S[h.lookups] if h.lookups < len(LOOKUP_WAITS_S) else LOOKUP_EVERY_S
        h.next_lookup = self.clock() + wait
        if found is None or s.id not in self.held:
            return
        prices = self.prices.get(s.endpoint or "")
        usage = self._believed(s, *found, prices)
        usage = fill_cost(usage, prices)
        billed = usage if usage.cost_usd else None  # 0: not billed (a provider error, say)
        charge = None
        if billed is not None and s.dataset is not None:
            kind = "lost" if h.earlier_run else "failed_attempt"
            charge = Charge(
                s.item_id, s.dataset, billed, s.generation_id, s.endpoint, found[1], s.lane, kind
            )
        self._release(h, charge, billed)
        self.found += 1

    def _believed(
        self, s: Sent, usage: Usage, provider: str | None, prices: Prices | None
    ) -> Usage:
        """The record's usage if the gate believes it, else the request's worst case, counted
        now: a junk record never makes the run wait for the request's deadline. A record of
        nothing (no tokens, no cost) is OpenRouter's "not billed", and believed."""
        if self.gate is None:
            return usage
        max_tokens = self.max_tokens.get(s.lane or "") or max(self.max_tokens.values(), default=0)
        asked = Asked(
            max_tokens=max_tokens or round(s.tokens),
            worst_usd=s.worst_usd if s.worst_usd > 0 else None,
            floor_usd_per_token=prices.floor if prices is not None else None,
        )
        who = provider or s.endpoint or "the provider"
        return self.gate.usage(usage, asked, channel="/generation", who=who, where="record")

    async def _expire(self, expired: list[Held]) -> None:
        """Requests past their deadline with no bill found: count each at what its account's
        spend beyond the ledger allows, at most its worst case (the worst case where the
        account cannot be read)."""
        self.flush()
        left = dict(await self.unexplained())
        for h in expired:
            if h.sent.id not in self.held:
                continue
            s = h.sent
            account = self.account_of.get(s.endpoint or "")
            room = left.get(account, s.worst_usd) if account is not None else s.worst_usd
            usd = max(0.0, min(s.worst_usd, room))
            if account is not None and account in left:
                left[account] = room - usd
            charge = None
            usage = None
            if usd > 0 and s.dataset is not None:
                usage = Usage(0, round(s.tokens), 0, usd)
                charge = Charge(
                    s.item_id,
                    s.dataset,
                    usage,
                    s.generation_id,
                    s.endpoint,
                    None,
                    s.lane,
                    "unverified",
                )
                self.released_unverified += usd
            self._release(h, charge, usage)

    def _release(self, h: Held, charge: Charge | None, usage: Usage | None) -> None:
        s = h.sent
        del self.held[s.id]
        awaited = bool(s.generation_id)
        if h.earlier_run:
            self._free(s.worst_usd - ((usage.cost_usd or 0.0) if usage else 0.0))
        self.book.release(s.dataset, s.worst_usd, s.tokens, usage, awaited=awaited)
        self.settle(charge, s.id)
