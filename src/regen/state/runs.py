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

BLIP_S = 1.5
"""An endpoint back in its pool within this long passed its first health probe (0.5 s after it
left, engine.scheduler.PROBE_EVERY_S): a dropped connection with the server up, not an outage."""


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
    end_kind: str | None = None
    """How it ended (m014; None: still running, killed, or recorded before m014)."""
    exit_code: int | None = None
    """The exit code its command returned (None: not known)."""
    killed: bool = False
    """It never recorded its end: killed, or still running."""

    def ending(self, live: bool = False) -> str:
        """How the run ended, in words: `live` when it is the run holding the directory."""
        if live:
            return "running"
        if self.killed:
            return "killed (no end recorded: kill -9, a crash or a power cut)"
        kind = self.end_kind or ("finished" if self.stop_reason is None else "stopped")
        words = kind
        if self.stop_reason and kind not in ("finished", "interrupted"):
            words += f": {self.stop_reason}"
        if self.exit_code is not None:
            words += f" (exit {self.exit_code})"
        return words


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

    @property
    def is_outage(self) -> bool:
        """Out for at least BLIP_S, or not back yet: a server out of service, not one dropped
        connection."""
        return self.ended_at is None or self.ended_at - self.started_at >= BLIP_S


ADAPTIVE_SHARE = 0.72
"""Against a provider that refuses what it cannot take, the adaptive limit saws below its
capacity and pauses for each Retry-After: measured, the lane keeps about this share of the
provider's capacity on the wire (bench/plan.py, workload `capacity`: 14.9 of 21 when set; on
7 December 2026 17.4-18.0 of the 21-25 its pilots saw answered at once, 0.71-0.86 over six
seeds; 0.41 against tests' provider of 6, whose Retry-After is long beside its answers). A
guess, then: a run's ETA shows what rests on it as `prior`."""
MIN_RUN_SAMPLES = 20
"""Timeline points (seconds) a run needs before its mean on the wire stands for the next."""


@dataclass(frozen=True, slots=True)
class LaneCapacity:
    """What a lane's provider let it keep on the wire: requests refused for capacity (429s)
    in all runs, the most answered at once, and the latest run's mean requests on the wire
    over its middle 80% (None: no finished run)."""

    refused: int
    most_answered: int
    run_in_flight: float | None
    run_samples: int

    @property
    def run_measured(self) -> bool:
        """Whether the latest finished run ran long enough for its mean on the wire to stand
        for the next run's."""
        return self.run_in_flight is not None and self.run_samples >= MIN_RUN_SAMPLES

    def on_wire(self) -> float | None:
        """The requests the provider is expected to let the lane keep on the wire: None where
        it refused none for capacity (the lane's own concurrency then); else what the latest
        finished run kept, or, with only a pilot's answers, ADAPTIVE_SHARE of the most it
        answered at once. One rule for the plan (forecast.on_wire_for) and for a run's ETA
        until the run has measured its own pace (eta.Concurrency.ceiling)."""
        if self.refused == 0:
            return None
        if self.run_measured and self.run_in_flight is not None:
            return self.run_in_flight
        return ADAPTIVE_SHARE * self.most_answered


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

    def end(self, run_id: int, stop_reason: str | None, end_kind: str | None = None) -> None:
        """Record that a run ends now, why (`stop_reason`) and how (`end_kind`)."""
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET ended_at = ?, stop_reason = ?, end_kind = ? WHERE id = ?",
                (time.time(), stop_reason, end_kind, run_id),
            )

    def set_exit_code(self, code: int) -> None:
        """Record the exit code of the latest run, once it has ended (a run started since, not
        ended yet, is left alone)."""
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET exit_code = ? WHERE id = (SELECT MAX(id) FROM runs "
                "WHERE kind = 'run') AND ended_at IS NOT NULL AND exit_code IS NULL",
                (code,),
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
        """Every run's outages, oldest first (a connection dropped by a server that was back
        at its first probe is none: OutageRecord.is_outage)."""
        rows = self._db.execute(
            "SELECT run_id, endpoint, started_at, ended_at, resent FROM outages ORDER BY started_at"
        ).fetchall()
        return [o for o in (OutageRecord(*r) for r in rows) if o.is_outage]

    def all(self) -> list[RunRecord]:
        """Every run and pilot, oldest first; a killed one ends at its last timeline point."""
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(runs)")}
        ends = "r.end_kind, r.exit_code" if "end_kind" in columns else "NULL, NULL"
        rows = self._db.execute(
            "SELECT r.id, r.kind, r.started_at, "
            "COALESCE(r.ended_at, (SELECT MAX(t) FROM timeline WHERE run_id = r.id)), "
            f"r.stop_reason, r.max_cost_usd, r.lanes, {ends}, r.ended_at IS NULL "
            "FROM runs r ORDER BY r.id"
        ).fetchall()
        return [
            RunRecord(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8], bool(r[9]))
            for r in rows
        ]

    def timeline(self) -> list[TimelinePoint]:
        rows = self._db.execute(
            "SELECT run_id, t, lane, in_flight, limit_now, concurrency FROM timeline "
            "ORDER BY run_id, t"
        ).fetchall()
        return [TimelinePoint(*r) for r in rows]

    def earlier_on_wire(self, min_points: int = 5, before: int | None = None) -> dict[str, float]:
        """Per lane, the mean requests on the wire over the middle 80% of the latest run (not a
        pilot: its rounds wait for their slowest answer) that has `min_points` timeline points
        for it, killed runs included: the pace a new run's ETA starts from. `before`: of the
        runs before this run id only (bench/eta_replay.py, replaying that run)."""
        out: dict[str, float] = {}
        rows = self._db.execute(
            "SELECT run_id, lane, t, in_flight FROM timeline WHERE run_id IN "
            "(SELECT id FROM runs WHERE kind = 'run' AND (? IS NULL OR id < ?)) "
            "ORDER BY run_id DESC, t",
            (before, before),
        )
        points: dict[tuple[int, str], list[tuple[float, int]]] = {}
        for run_id, lane, t, in_flight in rows:
            points.setdefault((run_id, lane), []).append((float(t), int(in_flight)))
        for (_, lane), pts in points.items():  # newest run first
            if lane in out or len(pts) < min_points:
                continue
            lo = pts[0][0] + 0.1 * (pts[-1][0] - pts[0][0])
            hi = pts[0][0] + 0.9 * (pts[-1][0] - pts[0][0])
            middle = [n for t, n in pts if lo <= t <= hi] or [n for _, n in pts]
            if sum(middle) > 0:
                out[lane] = sum(middle) / len(middle)
        return out

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
