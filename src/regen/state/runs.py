"""The job's runs and their timeline: when each started and ended, why it stopped, its lanes,
each lane's requests on the wire over time, and the endpoints taken out of their pool (tables
`runs`, `timeline`, `outages`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from regen.state.owner import Owner


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run (or pilot) of the job: when it started and ended (None: it was killed; the
    last timeline point stands in), why it stopped, the job's dollar cap and its lanes then
    ({lane: {"max_tokens": N, "concurrency": N, "escalate_to": name or None}})."""

    id: int
    kind: str
    started_at: float
    ended_at: float | None
    stop_reason: str | None
    max_cost_usd: float | None
    lanes: dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One lane at one moment of a run: requests on the wire and the adaptive limit."""

    run_id: int
    t: float
    lane: str
    in_flight: int
    limit: int
    concurrency: int


@dataclass(frozen=True, slots=True)
class OutageRecord:
    """An endpoint out of its pool in a run, from `started_at` until `ended_at` (None: it was
    still out when the run last wrote it), with the requests that went elsewhere meanwhile."""

    run_id: int
    endpoint: str
    started_at: float
    ended_at: float | None
    resent: int


@dataclass(frozen=True, slots=True)
class LaneCapacity:
    """What a lane's provider let it keep on the wire: requests refused for capacity (429s)
    in all runs, the most answered at once, and the latest run's mean requests on the wire
    over its middle 80% (None: no finished run)."""

    refused: int
    most_answered: int
    run_in_flight: float | None
    run_samples: int


class Runs(Owner):
    """The `runs` and `timeline` tables."""

    def begin(self, kind: str, max_cost_usd: float | None, lanes: dict[str, dict[str, Any]]) -> int:
        """Record that a run (or a pilot) starts now; its id."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs (kind, started_at, max_cost_usd, lanes) VALUES (?, ?, ?, ?)",
                (kind, time.time(), max_cost_usd, json.dumps(lanes, sort_keys=True)),
            )
            return int(cur.lastrowid or 0)

    def end(self, run_id: int, stop_reason: str | None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET ended_at = ?, stop_reason = ? WHERE id = ?",
                (time.time(), stop_reason, run_id),
            )

    def add_timeline(self, points: Iterable[TimelinePoint]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO timeline VALUES (?, ?, ?, ?, ?, ?)",
                [(p.run_id, p.t, p.lane, p.in_flight, p.limit, p.concurrency) for p in points],
            )

    def save_outages(self, outages: Iterable[OutageRecord]) -> None:
        """Write (or update) the run's outages as they stand now."""
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO outages VALUES (?, ?, ?, ?, ?)",
                [(o.run_id, o.endpoint, o.started_at, o.ended_at, o.resent) for o in outages],
            )

    def outages(self) -> list[OutageRecord]:
        """Every run's outages, oldest first."""
        rows = self._db.execute(
            "SELECT run_id, endpoint, started_at, ended_at, resent FROM outages ORDER BY started_at"
        ).fetchall()
        return [OutageRecord(*r) for r in rows]

    def all(self) -> list[RunRecord]:
        """Every run and pilot, oldest first; a killed one ends at its last timeline point."""
        rows = self._db.execute(
            "SELECT r.id, r.kind, r.started_at, "
            "COALESCE(r.ended_at, (SELECT MAX(t) FROM timeline WHERE run_id = r.id)), "
            "r.stop_reason, r.max_cost_usd, r.lanes FROM runs r ORDER BY r.id"
        ).fetchall()
        return [RunRecord(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    def timeline(self) -> list[TimelinePoint]:
        rows = self._db.execute(
            "SELECT run_id, t, lane, in_flight, limit_now, concurrency FROM timeline "
            "ORDER BY run_id, t"
        ).fetchall()
        return [TimelinePoint(*r) for r in rows]

    def lane_capacity(self, recent: int = 20_000) -> dict[str, LaneCapacity]:
        """Per lane, what its provider let it keep on the wire (see LaneCapacity)."""
        out: dict[str, LaneCapacity] = {}
        refused = dict(
            self._db.execute(
                "SELECT lane, COUNT(*) FROM attempts WHERE lane IS NOT NULL AND "
                "(status = 429 OR failure_class = 'rate_limited') GROUP BY lane"
            ).fetchall()
        )
        spans: dict[str, list[tuple[float, int]]] = {}
        for lane, start, latency in self._db.execute(
            "SELECT lane, started_at, latency_s FROM attempts WHERE lane IS NOT NULL AND "
            "failure_class IS NULL ORDER BY id DESC LIMIT ?",
            (recent,),
        ):
            events = spans.setdefault(lane, [])
            events.append((start, 1))
            events.append((start + latency, -1))
        for lane, events in spans.items():
            now = most = 0
            for _, step in sorted(events):
                now += step
                most = max(most, now)
            out[lane] = LaneCapacity(int(refused.get(lane, 0)), most, None, 0)
        last_run = self._db.execute(
            "SELECT id, started_at, ended_at FROM runs WHERE kind = 'run' AND ended_at IS NOT "
            "NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if last_run is not None:
            run_id, start, end = last_run
            lo, hi = start + 0.1 * (end - start), start + 0.9 * (end - start)
            for lane, mean, n in self._db.execute(
                "SELECT lane, AVG(in_flight), COUNT(*) FROM timeline "
                "WHERE run_id = ? AND t BETWEEN ? AND ? GROUP BY lane",
                (run_id, lo, hi),
            ):
                if lane in out:
                    out[lane] = replace(out[lane], run_in_flight=float(mean), run_samples=n)
        return out
