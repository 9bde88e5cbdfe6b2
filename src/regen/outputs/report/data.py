"""What the report shows, read from state.db into plain dataclasses.

`gather` reads each table once (results, attempts, ledger, lanes, runs and their
timeline) and attributes answers, spend and the last event to each run; nothing here
knows about pixels or HTML, so the drawing modules above it only read these values.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from regen.state.db import Store
from regen.state.runs import RunRecord, TimelinePoint
from regen.state.work import DatasetProgress

RUNS_SCHEMA = 7
"""The schema version (m007_runs) from which state.db records runs, the timeline and lanes."""
RATE_LIMITED = "rate_limited"


@dataclass
class DatasetReport:
    progress: DatasetProgress
    finished_at: array[float] = field(default_factory=lambda: array("d"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    latencies: array[float] = field(default_factory=lambda: array("d"))
    providers: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    lanes: dict[tuple[str | None, bool], int] = field(default_factory=dict)
    """Done items by (lane that answered, whether a shorter lane's truncated answer escalated)."""
    escalated_charges: int = 0
    """Truncated answers paid for and sent again on a longer lane."""


@dataclass
class JobFacts:
    """The job's history: its runs, their timeline, and the time of every event (sorted)."""

    runs: list[RunRecord]
    recorded: bool
    """False: state.db predates the record of runs (schema < 7); no runs, timeline or lanes."""
    timeline: list[TimelinePoint] = field(default_factory=list)
    answers: array[float] = field(default_factory=lambda: array("d"))
    failures: list[tuple[float, str, str | None]] = field(default_factory=list)
    """(started at, class, lane) of every failed attempt."""
    rate_limited: list[tuple[float, str | None]] = field(default_factory=list)
    """(started at, lane) of every attempt answered 429 or classed rate_limited."""
    charge_times: array[float] = field(default_factory=lambda: array("d"))
    charge_cum: array[float] = field(default_factory=lambda: array("d"))
    """USD charged up to and including each charge (in time order)."""
    lane_attempts: dict[str | None, int] = field(default_factory=dict)
    lane_429s: dict[str | None, int] = field(default_factory=dict)
    escalated_charges: int = 0
    escalated_usd: float = 0.0
    run_answers: list[int] = field(default_factory=list)
    run_usd: list[float] = field(default_factory=list)
    run_last: list[float] = field(default_factory=list)
    """The last event in each run: where a run killed before its first sample ends."""
    outside: set[int] = field(default_factory=set)
    """Whole seconds with activity outside every recorded run (runs made before the record)."""

    def spent_by(self, t: float) -> float:
        """USD charged at or before `t`."""
        i = bisect_right(self.charge_times, t)
        return self.charge_cum[i - 1] if i else 0.0


@dataclass
class Report:
    job: JobFacts
    datasets: list[DatasetReport]


SLACK_S = 2.0
"""A run's last commits land just after the sample that stands in for a killed run's end."""


def run_windows(runs: list[RunRecord]) -> list[tuple[float, float]]:
    """(start, end) of the time each run's events may fall in: to its end (plus SLACK_S), or,
    for a run killed before its first sample, until the next run starts."""
    out = []
    for i, r in enumerate(runs):
        following = runs[i + 1].started_at if i + 1 < len(runs) else math.inf
        end = following if r.ended_at is None else min(r.ended_at + SLACK_S, following)
        out.append((r.started_at, end))
    return out


def _sorted(values: array[float]) -> array[float]:
    ordered = all(map(operator.le, values, itertools.islice(values, 1, None)))
    return values if ordered else array("d", sorted(values))


def gather(store: Store) -> Report:
    """Read everything the page shows, each table once, in one pass each."""
    recorded = store.schema_version() >= RUNS_SCHEMA
    runs = store.runs.all() if recorded else []
    job = JobFacts(runs=runs, recorded=recorded)
    job.timeline = store.runs.timeline() if recorded else []

    reports = {p.name: DatasetReport(p) for p in store.work.dataset_progress()}
    add_answer = job.answers.append
    served: dict[tuple[str, str | None, str | None], int] = {}
    current, r = None, None
    for ds, created, tokens, latency, provider, finish in store.answers.result_facts():
        add_answer(created)
        if ds != current:
            current, r = ds, reports.get(ds)
        if r is None:
            continue
        r.finished_at.append(created)
        r.completion_tokens.append(tokens)
        r.latencies.append(latency)
        key = (ds, provider, finish)
        served[key] = served.get(key, 0) + 1
    for (ds, provider, finish), n in served.items():
        r = reports[ds]
        name = provider or "(not said)"
        r.providers[name] = r.providers.get(name, 0) + n
        reason = finish or "(none)"
        r.finish_reasons[reason] = r.finish_reasons.get(reason, 0) + n
    for (ds, cls), n in store.spend.failure_counts().items():
        if ds in reports:
            reports[ds].errors[cls] = n

    def failed(t: float, status: int | None, cls: str | None, lane: str | None) -> None:
        if status == 429 or cls == RATE_LIMITED:
            job.rate_limited.append((t, lane))
            job.lane_429s[lane] = job.lane_429s.get(lane, 0) + 1
        if cls is not None:
            job.failures.append((t, cls, lane))

    if recorded:
        tried = job.lane_attempts
        for a in store.spend.attempt_facts():
            tried[a.lane] = tried.get(a.lane, 0) + 1
            if a.failure_class is not None or a.status == 429:
                failed(a.started_at, a.status, a.failure_class, a.lane)
    else:
        # Attempts made before lanes were recorded: only the failed ones carry what is drawn.
        for f in store.spend.recent_failures(limit=-1):
            failed(f.started_at, f.status, f.failure_class, None)
    job.failures.sort()
    job.rate_limited.sort(key=lambda f: f[0])

    charges: list[tuple[float, float]] = []
    for created, usd, kind, ds in store.spend.ledger_facts():
        charges.append((created, usd))
        if kind == "escalated":
            job.escalated_charges += 1
            job.escalated_usd += usd
            if ds in reports:
                reports[ds].escalated_charges += 1
    if any(a[0] > b[0] for a, b in itertools.pairwise(charges)):
        charges.sort()
    job.charge_times = array("d", (t for t, _ in charges))
    job.charge_cum = array("d", itertools.accumulate(usd for _, usd in charges))
    del charges
    if recorded:
        for (ds, lane, escalated), n in store.work.item_lanes().items():
            if ds in reports:
                reports[ds].lanes[(lane, escalated)] = n

    job.answers = _sorted(job.answers)
    for r in reports.values():
        r.finished_at = _sorted(r.finished_at)
    _attribute(job)
    return Report(job, list(reports.values()))


def _attribute(job: JobFacts) -> None:
    """Per run, its answers, spend and last event; and the seconds with activity outside
    every run, from the sorted event times."""
    failures = array("d", (t for t, _, _ in job.failures))
    events = (job.answers, job.charge_times, failures)
    job.run_answers, job.run_usd, job.run_last = [], [], []
    after = [0, 0, 0]  # per event list: where the previous window ended
    for start, end in run_windows(job.runs):
        last = start
        for k, times in enumerate(events):
            lo, hi = bisect_left(times, start), bisect_right(times, end)
            job.outside.update(map(int, times[after[k] : lo]))
            after[k] = max(after[k], hi)
            if hi > lo:
                last = max(last, times[hi - 1])
        job.run_answers.append(bisect_right(job.answers, end) - bisect_left(job.answers, start))
        job.run_usd.append(job.spent_by(end) - job.spent_by(math.nextafter(start, -math.inf)))
        job.run_last.append(last)
    for k, times in enumerate(events):
        job.outside.update(map(int, times[after[k] :]))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def run_labels(runs: list[RunRecord]) -> list[str]:
    """`pilot`, `run 1`, `run 2`, ...: runs numbered apart from pilots."""
    labels, n = [], 0
    for r in runs:
        if r.kind == "pilot":
            labels.append("pilot")
        else:
            n += 1
            labels.append(f"run {n}")
    return labels
