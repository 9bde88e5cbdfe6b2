"""What was sent and what it cost: every attempt and every charge (tables `attempts`,
`ledger`; what may still be billed is `outstanding.py`'s)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from regen.state.owner import Owner, Rows


@dataclass(frozen=True, slots=True)
class LaneAnswers:
    """A lane and dataset's answers charged so far (`Spend.lane_answers`)."""

    answered: int
    escalated: int
    """Of them, truncated and sent on to a longer lane."""
    cost_usd: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class AttemptFact:
    """One attempt, as the report and the plan read it (lane None: made before lanes were
    recorded)."""

    started_at: float
    latency_s: float
    status: int | None
    failure_class: str | None
    dataset: str
    lane: str | None


@dataclass(frozen=True, slots=True)
class FlowEntry:
    """One finished passage of an item through a lane, as `regen plan` measures lanes."""

    lane: str | None
    dataset: str
    outcome: str
    """`done`, `failed`, or `escalated` (its truncated answer went on to a longer lane)."""
    prompt_tokens_est: int
    attempts: int
    ok: int
    """Attempts that were answered."""
    wire_s: float
    """Time on the wire, over all its attempts there."""
    span_s: float
    """From its first attempt's start to its last one's end: wire time, back-offs and waits
    for a slot between attempts."""
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    """Everything charged for it there: its answer and any billed failed attempt."""


@dataclass(frozen=True, slots=True)
class CacheUse:
    """The prompt tokens charged in one (lane, dataset), and how many a provider's cache
    served (read) or stored (written)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    first_prompt_tokens: int = 0
    """Of each conversation's first answer: what only other conversations could have cached."""
    first_cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt, as `regen status` lists it."""

    started_at: float
    dataset: str
    item_id: str
    failure_class: str
    status: int | None
    message: str | None


@dataclass(frozen=True, slots=True)
class EndpointTotals:
    """What one endpoint of the pool did for the job, over all runs."""

    endpoint: str
    answers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    failed: int = 0
    """Failed attempts (each failed request, however its item ended)."""


class Spend(Owner):
    """The `attempts` and `ledger` tables."""

    @staticmethod
    def record_in(
        db: sqlite3.Connection, attempts: Rows, ledger: Rows, *, cache_use: bool = True
    ) -> None:
        """Record attempts and charges (outcomes.py's rows) in the open transaction
        (`cache_use`: the rows end with their cached and written prompt tokens, m015)."""
        db.executemany(
            "INSERT INTO attempts (item_id, number, started_at, latency_s, status, "
            "failure_class, message, provider, generation_id, lane, endpoint) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            attempts,
        )
        db.executemany(
            "INSERT INTO ledger (item_id, dataset, kind, prompt_tokens, completion_tokens, "
            "cost_usd, created_at, endpoint, provider, generation_id, lane"
            + (", cached_tokens, cache_write_tokens) VALUES (?,?," if cache_use else ") VALUES (")
            + "?,?,?,?,?,?,?,?,?,?,?)",
            ledger,
        )

    def ledger_usd(self, endpoints: Iterable[str]) -> float:
        """What the ledger charged to these endpoints, in USD."""
        names = list(endpoints)
        (total,) = self._db.execute(
            "SELECT COALESCE(SUM(cost_usd), 0.0) FROM ledger "
            f"WHERE endpoint IN ({','.join('?' * len(names))})",
            names,
        ).fetchone()
        return float(total)

    def failure_counts(self) -> dict[tuple[str, str], int]:
        """Failed attempts by (dataset, class), from the attempt log."""
        rows = self._db.execute(
            "SELECT i.dataset, a.failure_class, COUNT(*) FROM attempts a "
            "JOIN items i ON i.id = a.item_id WHERE a.failure_class IS NOT NULL "
            "GROUP BY i.dataset, a.failure_class"
        ).fetchall()
        return {(d, c): n for d, c, n in rows}

    def by_endpoint(self) -> list[EndpointTotals]:
        """Per endpoint of the job's pool, over all runs: what it answered (the ledger's
        completions), what that used and cost, and its failed attempts. Charges and attempts
        recorded before endpoints were (schema 3 and 12) have none and are left out."""
        totals: dict[str, EndpointTotals] = {}
        for endpoint, answers, prompt, completion, cost in self._db.execute(
            "SELECT endpoint, SUM(kind = 'completion'), SUM(prompt_tokens), "
            "SUM(completion_tokens), SUM(cost_usd) FROM ledger WHERE endpoint IS NOT NULL "
            "GROUP BY endpoint"
        ):
            totals[endpoint] = EndpointTotals(
                endpoint, int(answers), int(prompt), int(completion), float(cost or 0.0)
            )
        for endpoint, failed in self._db.execute(
            "SELECT endpoint, COUNT(*) FROM attempts "
            "WHERE endpoint IS NOT NULL AND failure_class IS NOT NULL GROUP BY endpoint"
        ):
            known = totals.get(endpoint) or EndpointTotals(endpoint)
            totals[endpoint] = replace(known, failed=int(failed))
        return [totals[name] for name in sorted(totals)]

    def recent_failures(self, limit: int = 10) -> list[FailedAttempt]:
        """The last failed attempts, newest first."""
        rows = self._db.execute(
            "SELECT a.started_at, i.dataset, a.item_id, a.failure_class, a.status, a.message "
            "FROM attempts a JOIN items i ON i.id = a.item_id "
            "WHERE a.failure_class IS NOT NULL ORDER BY a.id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [FailedAttempt(*r) for r in rows]

    def top_failure_reasons(self, limit: int = 5) -> list[tuple[str, str, int]]:
        """The commonest (class, message) of failed attempts, with their counts."""
        rows = self._db.execute(
            "SELECT failure_class, COALESCE(message, ''), COUNT(*) AS n FROM attempts "
            "WHERE failure_class IS NOT NULL GROUP BY failure_class, message "
            "ORDER BY n DESC, failure_class LIMIT ?",
            (limit,),
        ).fetchall()
        return [(c, m, n) for c, m, n in rows]

    def endpoint_failures(self) -> dict[tuple[str, str], int]:
        """Failed attempts by (endpoint, class); those recorded before attempts named their
        endpoint (schema 12) are left out."""
        rows = self._db.execute(
            "SELECT endpoint, failure_class, COUNT(*) FROM attempts "
            "WHERE endpoint IS NOT NULL AND failure_class IS NOT NULL GROUP BY 1, 2"
        ).fetchall()
        return {(e, c): n for e, c, n in rows}

    def attempt_facts(self) -> Iterator[AttemptFact]:
        """Every attempt, in the order recorded."""
        for r in self._db.execute(
            "SELECT a.started_at, a.latency_s, a.status, a.failure_class, i.dataset, a.lane "
            "FROM attempts a JOIN items i ON i.id = a.item_id ORDER BY a.id"
        ):
            yield AttemptFact(*r)

    def ledger_facts(self) -> Iterator[tuple[float, float, str, str]]:
        """(charged at, USD, kind, dataset) of every charge, in the order made; kind is
        `completion`, `escalated` (a truncated answer sent again on a longer lane), or one of
        the charges learnt after the fact (`Charge.kind`)."""
        yield from self._db.execute(
            "SELECT created_at, COALESCE(cost_usd, 0.0), kind, dataset FROM ledger ORDER BY id"
        )

    def flow_entries(self) -> Iterator[FlowEntry]:
        """Every finished passage of an item through a lane (its answer, its failure, or the
        truncated answer that sent it on to a longer lane), with what it took there. Charges
        and attempts recorded before lanes were (lane NULL) count in the item's lane now."""
        yield from (
            FlowEntry(*r)
            for r in self._db.execute(
                """
                WITH a AS (
                    SELECT a.item_id, COALESCE(a.lane, i.lane) AS lane, i.dataset,
                           i.prompt_tokens_est AS est,
                           CASE WHEN i.status != 'pending' AND COALESCE(a.lane, i.lane) = i.lane
                                THEN i.status ELSE 'escalated' END AS outcome,
                           COUNT(*) AS attempts, SUM(a.latency_s) AS wire_s,
                           MAX(a.started_at + a.latency_s) - MIN(a.started_at) AS span_s,
                           SUM(a.failure_class IS NULL) AS ok
                    FROM attempts a JOIN items i ON i.id = a.item_id
                    WHERE i.status != 'pending' OR COALESCE(a.lane, i.lane) != i.lane
                    GROUP BY a.item_id, COALESCE(a.lane, i.lane)
                ),
                l AS (
                    SELECT l.item_id, COALESCE(l.lane, i.lane) AS lane,
                           SUM(l.prompt_tokens) AS pt, SUM(l.completion_tokens) AS ct,
                           SUM(COALESCE(l.cost_usd, 0)) AS usd
                    FROM ledger l JOIN items i ON i.id = l.item_id
                    GROUP BY l.item_id, COALESCE(l.lane, i.lane)
                )
                SELECT a.lane, a.dataset, a.outcome, a.est, a.attempts, a.ok, a.wire_s,
                       a.span_s, COALESCE(l.pt, 0), COALESCE(l.ct, 0), COALESCE(l.usd, 0.0)
                FROM a LEFT JOIN l ON l.item_id = a.item_id AND l.lane = a.lane
                """
            )
        )

    def cache_use(self) -> dict[tuple[str | None, str], CacheUse]:
        """Per (lane, dataset), the prompt tokens charged, cached and written (m015), over
        every charge and over each conversation's first answered charge."""
        rows = self._db.execute(
            """
            WITH l AS (
                SELECT l.id, COALESCE(l.lane, i.lane) AS lane, i.dataset, i.conversation_id,
                       l.kind, l.prompt_tokens, l.cached_tokens, l.cache_write_tokens
                FROM ledger l JOIN items i ON i.id = l.item_id
            ),
            firsts AS (
                SELECT MIN(id) AS id FROM l WHERE kind IN ('completion', 'escalated')
                GROUP BY conversation_id
            )
            SELECT lane, dataset, SUM(prompt_tokens), SUM(cached_tokens),
                   SUM(cache_write_tokens),
                   SUM(CASE WHEN id IN firsts THEN prompt_tokens ELSE 0 END),
                   SUM(CASE WHEN id IN firsts THEN cached_tokens ELSE 0 END)
            FROM l GROUP BY lane, dataset
            """
        ).fetchall()
        return {(lane, ds): CacheUse(*map(int, rest)) for lane, ds, *rest in rows}

    def answer_latencies(self, lane: str, limit: int = 4096) -> list[float]:
        """Times on the wire of a lane's latest successful attempts."""
        rows = self._db.execute(
            "SELECT a.latency_s FROM attempts a JOIN items i ON i.id = a.item_id "
            "WHERE COALESCE(a.lane, i.lane) = ? AND a.failure_class IS NULL "
            "ORDER BY a.id DESC LIMIT ?",
            (lane, limit),
        ).fetchall()
        return [float(r[0]) for r in rows]

    def item_totals(self) -> dict[str, list[tuple[dict[str, float], float]]]:
        """Per dataset, each finished item's time on the wire in each lane it passed through
        (every attempt) and what was charged for it: what one more item of it takes."""
        wire: dict[int, tuple[str, dict[str, float]]] = {}
        for item, ds, lane, wire_s in self._db.execute(
            "SELECT i.id, i.dataset, COALESCE(a.lane, i.lane, ''), SUM(a.latency_s) "
            "FROM attempts a JOIN items i ON i.id = a.item_id WHERE i.status != 'pending' "
            "GROUP BY i.id, 3"
        ):
            wire.setdefault(item, (ds, {}))[1][lane] = float(wire_s)
        usd = dict(
            self._db.execute(
                "SELECT l.item_id, SUM(COALESCE(l.cost_usd, 0)) FROM ledger l "
                "JOIN items i ON i.id = l.item_id WHERE i.status != 'pending' GROUP BY l.item_id"
            )
        )
        out: dict[str, list[tuple[dict[str, float], float]]] = {}
        for item, (ds, lanes) in wire.items():
            out.setdefault(ds, []).append((lanes, float(usd.get(item, 0.0))))
        return out

    def lane_answers(self) -> dict[tuple[str, str], LaneAnswers]:
        """Answers per (lane, dataset) charged so far, how many of them were truncated and
        sent on to a longer lane, what they cost, and their prompt and completion tokens."""
        rows = self._db.execute(
            "SELECT lane, dataset, COUNT(*), SUM(kind = 'escalated'), "
            "COALESCE(SUM(cost_usd), 0), SUM(prompt_tokens), SUM(completion_tokens) FROM ledger "
            "WHERE lane IS NOT NULL AND kind IN ('completion', 'escalated') "
            "GROUP BY lane, dataset"
        ).fetchall()
        return {
            (lane, ds): LaneAnswers(n, e, float(usd), int(p), int(c))
            for lane, ds, n, e, usd, p, c in rows
        }

    def earlier_costs(self, limit: int = 20_000) -> dict[tuple[str, str], list[tuple[int, float]]]:
        """The latest answers' bills (up to `limit`), newest first, with their items'
        estimated prompt tokens, by (lane, dataset): what a new run prices the items to come
        from."""
        out: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for lane, ds, est, usd in self._db.execute(
            "SELECT l.lane, l.dataset, i.prompt_tokens_est, l.cost_usd FROM ledger l "
            "JOIN items i ON i.id = l.item_id WHERE l.lane IS NOT NULL "
            "AND l.kind IN ('completion', 'escalated') AND l.cost_usd IS NOT NULL "
            "ORDER BY l.id DESC LIMIT ?",
            (limit,),
        ):
            out.setdefault((lane, ds), []).append((int(est), float(usd)))
        return out

    def earlier_latencies(
        self, limit: int = 20_000
    ) -> dict[tuple[str | None, str], list[tuple[float, int]]]:
        """Times on the wire of the latest successful attempts (up to `limit`), with their
        items' estimated prompt tokens, by (lane, dataset): what a new run's ETA starts from."""
        out: dict[tuple[str | None, str], list[tuple[float, int]]] = {}
        for lane, ds, t, est in self._db.execute(
            "SELECT COALESCE(a.lane, i.lane), i.dataset, a.latency_s, i.prompt_tokens_est "
            "FROM attempts a JOIN items i ON i.id = a.item_id WHERE a.failure_class IS NULL "
            "ORDER BY a.id DESC LIMIT ?",
            (limit,),
        ):
            out.setdefault((lane, ds), []).append((float(t), int(est)))
        return out
