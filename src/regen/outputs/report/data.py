"""What the report shows, read from state.db into plain dataclasses.

`gather` reads each table once (results, attempts, ledger, lanes, runs and their
timeline), attributes answers, spend and the last event to each run, and sums each
endpoint's answers; nothing here knows about pixels or HTML, so the drawing modules above
it only read these values.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any

from regen.state.db import Store
from regen.state.runs import OutageRecord, RunRecord, TimelinePoint
from regen.state.work import DatasetProgress

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
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    """Of the answers' completion tokens, those the server counted as reasoning (0 where it
    said nothing of reasoning)."""


@dataclass
class EndpointReport:
    """The answers one endpoint of the job gave (name None: answers stored before answers
    named their endpoint)."""

    name: str | None
    finished_at: array[float] = field(default_factory=lambda: array("d"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    """One per answer, in the order of `finished_at`."""
    latencies: array[float] = field(default_factory=lambda: array("d"))
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    """Failed attempts at it by class (schema 12 on)."""
    outages: list[OutageRecord] = field(default_factory=list)
    """Each time a run took it out of its pool (schema 12 on)."""


@dataclass
class JobFacts:
    """The job's history: its runs, their timeline, and the time of every event (sorted)."""

    runs: list[RunRecord]
    recorded: bool
    """False: state.db predates the record of runs (schema < 7); no runs, timeline or lanes."""
    timeline: list[TimelinePoint] = field(default_factory=list)
    answers: array[float] = field(default_factory=lambda: array("d"))
    answer_prompt: array[int] = field(default_factory=lambda: array("q"))
    answer_completion: array[int] = field(default_factory=lambda: array("q"))
    answer_reasoning: array[int] = field(default_factory=lambda: array("q"))
    """Tokens of each answer, in the order of `answers` (the time each was stored)."""
    attempts: array[float] = field(default_factory=lambda: array("d"))
    """The start of every attempt (sorted); empty when not recorded (schema < 7)."""
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
    live_run: int | None = None
    """The run that holds the output directory as the report is written (it has no end yet:
    running, not killed)."""
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
    endpoints: list[EndpointReport] = field(default_factory=list)


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


def _in_order(times: array[float]) -> bool:
    return all(map(operator.le, times, itertools.islice(times, 1, None)))


def _sorted(values: array[float]) -> array[float]:
    return values if _in_order(values) else array("d", sorted(values))


def _sort_by_time(times: array[float], *columns: array[int]) -> list[array[Any]]:
    """`times` sorted, with each column (one value per time) in the same order."""
    if _in_order(times):
        return [times, *columns]
    order = sorted(range(len(times)), key=times.__getitem__)
    arrays: list[array[Any]] = [times, *columns]
    return [array(a.typecode, map(a.__getitem__, order)) for a in arrays]


def _job_facts(store: Store, live: bool) -> JobFacts:
    """The job's runs and timeline; with `live`, its latest run without an end is running."""
    recorded = store.records("runs")
    runs = store.runs.all() if recorded else []
    job = JobFacts(runs=runs, recorded=recorded)
    if live and runs and runs[-1].killed:
        job.live_run = runs[-1].id
    job.timeline = store.runs.timeline() if recorded else []
    return job


def _read_answers(
    store: Store, job: JobFacts, reports: dict[str, DatasetReport]
) -> dict[str | None, EndpointReport]:
    """Every answer, in one pass: into the job's, its endpoint's and its dataset's series, and
    each dataset's providers and finish reasons. Returns the endpoints that answered."""
    endpoints: dict[str | None, EndpointReport] = {}
    served: dict[tuple[str, str | None, str | None], int] = {}
    current, r = None, None
    named = store.records("answer_endpoints")
    for fact in store.answers.result_facts(endpoint=named):
        job.answers.append(fact.created_at)
        job.answer_prompt.append(fact.prompt_tokens)
        job.answer_completion.append(fact.completion_tokens)
        job.answer_reasoning.append(fact.reasoning_tokens)
        e = endpoints.get(fact.endpoint)
        if e is None:
            e = endpoints[fact.endpoint] = EndpointReport(fact.endpoint)
        e.finished_at.append(fact.created_at)
        e.completion_tokens.append(fact.completion_tokens)
        e.latencies.append(fact.latency_s)
        e.prompt_tokens += fact.prompt_tokens
        e.reasoning_tokens += fact.reasoning_tokens
        e.cost_usd += fact.cost_usd or 0.0
        if fact.dataset != current:
            current, r = fact.dataset, reports.get(fact.dataset)
        if r is None:
            continue
        r.finished_at.append(fact.created_at)
        r.completion_tokens.append(fact.completion_tokens)
        r.latencies.append(fact.latency_s)
        r.prompt_tokens += fact.prompt_tokens
        r.reasoning_tokens += fact.reasoning_tokens
        key = (fact.dataset, fact.provider, fact.finish_reason)
        served[key] = served.get(key, 0) + 1
    _add_served(reports, served)
    return endpoints


def _add_served(
    reports: dict[str, DatasetReport], served: dict[tuple[str, str | None, str | None], int]
) -> None:
    """Each dataset's answers by provider and by finish reason, with names for the unsaid."""
    for (ds, provider, finish), n in served.items():
        r = reports[ds]
        name = provider or "(not said)"
        r.providers[name] = r.providers.get(name, 0) + n
        reason = finish or "(none)"
        r.finish_reasons[reason] = r.finish_reasons.get(reason, 0) + n


def _note_failure(
    job: JobFacts, t: float, status: int | None, cls: str | None, lane: str | None
) -> None:
    """A failed attempt (or a 429) into the job's rate-limited and failure series."""
    if status == 429 or cls == RATE_LIMITED:
        job.rate_limited.append((t, lane))
        job.lane_429s[lane] = job.lane_429s.get(lane, 0) + 1
    if cls is not None:
        job.failures.append((t, cls, lane))


def _read_attempts(store: Store, job: JobFacts) -> None:
    """Every attempt's time and lane, and the failed ones, both sorted by time."""
    if job.recorded:
        tried = job.lane_attempts
        for a in store.spend.attempt_facts():
            job.attempts.append(a.started_at)
            tried[a.lane] = tried.get(a.lane, 0) + 1
            if a.failure_class is not None or a.status == 429:
                _note_failure(job, a.started_at, a.status, a.failure_class, a.lane)
    else:
        # Attempts made before lanes were recorded: only the failed ones carry what is drawn.
        for f in store.spend.recent_failures(limit=-1):
            _note_failure(job, f.started_at, f.status, f.failure_class, None)
    job.failures.sort()
    job.rate_limited.sort(key=lambda f: f[0])


def _read_charges(store: Store, job: JobFacts, reports: dict[str, DatasetReport]) -> None:
    """The ledger as cumulative spend over time, and the escalated charges counted."""
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


def _read_outages(store: Store, endpoints: dict[str | None, EndpointReport]) -> None:
    """Each endpoint's failures and outages, when the store records outages."""
    if store.records("outages"):
        for (name, cls), n in store.spend.endpoint_failures().items():
            endpoints.setdefault(name, EndpointReport(name)).errors[cls] = n
        for o in store.runs.outages():
            endpoints.setdefault(o.endpoint, EndpointReport(o.endpoint)).outages.append(o)


def gather(store: Store, live: bool = False) -> Report:
    """Read everything the page shows, each table once, in one pass each. `live`: a process
    holds the output directory, so its latest run without an end is running."""
    job = _job_facts(store, live)
    reports = {p.name: DatasetReport(p) for p in store.work.dataset_progress()}
    endpoints = _read_answers(store, job, reports)
    for (ds, cls), n in store.spend.failure_counts().items():
        if ds in reports:
            reports[ds].errors[cls] = n
    _read_attempts(store, job)
    _read_charges(store, job, reports)
    if job.recorded:
        for (ds, lane, escalated), n in store.work.item_lanes().items():
            if ds in reports:
                reports[ds].lanes[(lane, escalated)] = n

    job.answers, job.answer_prompt, job.answer_completion, job.answer_reasoning = _sort_by_time(
        job.answers, job.answer_prompt, job.answer_completion, job.answer_reasoning
    )
    job.attempts = _sorted(job.attempts)
    for r in reports.values():
        r.finished_at = _sorted(r.finished_at)
    _read_outages(store, endpoints)
    for e in endpoints.values():
        e.finished_at, e.completion_tokens = _sort_by_time(e.finished_at, e.completion_tokens)
    _attribute(job)
    by_name = sorted(endpoints.values(), key=lambda e: (e.name is None, e.name or ""))
    return Report(job, list(reports.values()), by_name)


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
