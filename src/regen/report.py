"""`<out>/report.html`: what a job did, as one self-contained page.

First the job over time, run by run (answers per second, requests in flight against each
lane's adaptive limit, dollars spent against the cap, failed attempts by class, 429s), then
the lanes and their escalations, then per dataset: throughput, the completion-length
histogram marked at each lane's max_tokens, latency percentiles, cost, errors by class and
the providers that served. All read from state.db (read-only). Charts are inline SVG: the
page needs no script and no network, so it opens anywhere, offline.

Time axes leave out the time between runs (a marked break), so an idle night does not read
as a night of zero throughput. Every series is bucketed in one pass over the rows, so a
chart is a few hundred path points whatever the number of answers.
"""

from __future__ import annotations

import html
import itertools
import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from regen import __version__
from regen.errors import StateError
from regen.export import write_text_atomic
from regen.progress import per_mtok
from regen.store import DatasetProgress, RunRecord, Store, TimelinePoint

RUNS_SCHEMA = 7
"""The schema version (m007_runs) from which state.db records runs, the timeline and lanes."""
IDLE_GAP_S = 600.0
"""Without a record of runs, a stretch this long with nothing happening is cut from the axis."""
RATE_LIMITED = "rate_limited"
PALETTE = ("#2a7", "#27c", "#d62", "#a3c", "#c90", "#3aa", "#c36", "#777", "#68a", "#9a3")


# ---------------------------------------------------------------- what state.db says


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
    runs = store.runs() if recorded else []
    job = JobFacts(runs=runs, recorded=recorded)
    job.timeline = store.timeline() if recorded else []

    reports = {p.name: DatasetReport(p) for p in store.dataset_progress()}
    add_answer = job.answers.append
    served: dict[tuple[str, str | None, str | None], int] = {}
    current, r = None, None
    for ds, created, tokens, latency, provider, finish in store.result_facts():
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
    for (ds, cls), n in store.failure_counts().items():
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
        for a in store.attempt_facts():
            tried[a.lane] = tried.get(a.lane, 0) + 1
            if a.failure_class is not None or a.status == 429:
                failed(a.started_at, a.status, a.failure_class, a.lane)
    else:
        # Attempts made before lanes were recorded: only the failed ones carry what is drawn.
        for f in store.recent_failures(limit=-1):
            failed(f.started_at, f.status, f.failure_class, None)
    job.failures.sort()
    job.rate_limited.sort(key=lambda f: f[0])

    charges: list[tuple[float, float]] = []
    for created, usd, kind, ds in store.ledger_facts():
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
        for (ds, lane, escalated), n in store.item_lanes().items():
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


# ---------------------------------------------------------------- axes


def nice_step(span: float, target: int = 5) -> float:
    """The 1-2-5 step that cuts `span` into about `target` parts."""
    raw = span / max(target, 1)
    if not raw > 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag * (1 + 1e-9))


def nice_ticks(hi: float, target: int = 5, whole: bool = False) -> list[float]:
    """0, step, 2 step, ... up to the first multiple of the step at or above `hi` (a step of
    at least 1 for `whole` numbers: counts)."""
    hi = hi if hi > 0 else 1.0
    step = max(1.0, nice_step(hi, target)) if whole else nice_step(hi, target)
    n = max(1, math.ceil(hi / step - 1e-9))
    return [i * step for i in range(n + 1)]


def fmt_tick(v: float, step: float, prefix: str = "") -> str:
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if 0 < step < 1 else 0
    return f"{prefix}{v:,.{decimals}f}"


TIME_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
TIME_STEPS += (7200, 10800, 21600, 43200, 86400, 172800, 604800)


def time_step(seconds: float) -> float:
    """The clock-friendly step (1 s ... 1 week) at or above `seconds`."""
    return float(next((s for s in TIME_STEPS if s >= seconds), TIME_STEPS[-1]))


def fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def utc(t: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return datetime.fromtimestamp(t, UTC).strftime(fmt)


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of time drawn on a time axis; what lies between two spans is left out."""

    start: float
    end: float


def activity_spans(job: JobFacts) -> list[Span]:
    """One span per run, plus the stretches of activity outside every recorded run (all of
    it, for a state.db from before runs were recorded), split where nothing happened for
    IDLE_GAP_S; such a stretch within a few seconds of a run joins it."""
    runs = [
        Span(r.started_at, max(r.ended_at or r.started_at, last))
        for r, last in zip(job.runs, job.run_last, strict=True)
    ]
    spare: list[Span] = []
    for s in sorted(job.outside):
        if spare and s - spare[-1].end <= IDLE_GAP_S:
            spare[-1] = Span(spare[-1].start, s + 1.0)
        else:
            spare.append(Span(float(s), s + 1.0))
    for extra in spare:
        for i, run in enumerate(runs):
            if extra.start <= run.end + 5 and extra.end >= run.start - 5:
                runs[i] = Span(min(run.start, extra.start), max(run.end, extra.end))
                break
        else:
            runs.append(extra)
    return sorted(runs, key=lambda s: s.start)


@dataclass(frozen=True, slots=True)
class Bucket:
    """A step of a time axis: the times counted in it, the seconds it covers and where it
    is drawn."""

    span: int
    start: float
    until: float
    """Exclusive, except for a span's last (`closing`) bucket, which takes all to its end."""
    closing: bool
    seconds: float
    x0: float
    x1: float


GAP_PX = 14
MIN_SPAN_PX = 48
BUCKET_PX = 5


@dataclass
class TimeAxis:
    """Spans laid side by side across `width` pixels, each cut into buckets of whole seconds
    (a clock-friendly step) that the series are counted into."""

    spans: list[Span]
    x0: list[float]
    widths: list[float]
    bucket_s: list[float]
    first: list[int]
    """The index of each span's first bucket; buckets are numbered across spans."""
    n_buckets: int
    starts: list[float]
    _buckets: list[Bucket] | None = None

    @classmethod
    def build(cls, spans: list[Span], width: float) -> TimeAxis:
        n = len(spans)
        durations = [max(s.end - s.start, 1e-3) for s in spans]
        avail = width - GAP_PX * max(0, n - 1)
        if avail < MIN_SPAN_PX * n:
            widths = [avail / max(n, 1)] * n
        else:
            # Proportional to duration, but a short pilot still gets room to be seen.
            total = sum(durations)
            small = [d / total * avail < MIN_SPAN_PX for d in durations]
            rest = avail - MIN_SPAN_PX * sum(small)
            big_total = sum(d for d, s in zip(durations, small, strict=True) if not s) or 1.0
            widths = [
                MIN_SPAN_PX if s else d / big_total * rest
                for d, s in zip(durations, small, strict=True)
            ]
        x0, first, bucket_s, x, b = [], [], [], 0.0, 0
        for d, w in zip(durations, widths, strict=True):
            step = time_step(d / max(1, int(w / BUCKET_PX)))
            x0.append(x)
            first.append(b)
            bucket_s.append(step)
            x += w + GAP_PX
            b += max(1, math.ceil(d / step - 1e-9))
        return cls(spans, x0, widths, bucket_s, first, b, [s.start for s in spans])

    def _span_of(self, t: float) -> int:
        return max(0, bisect_right(self.starts, t) - 1)

    def x(self, t: float) -> float:
        i = self._span_of(t)
        s = self.spans[i]
        frac = min(1.0, max(0.0, (t - s.start) / max(s.end - s.start, 1e-3)))
        return self.x0[i] + frac * self.widths[i]

    def counter(self) -> Callable[[float], int]:
        """A function from a time to its bucket (-1: between spans)."""
        starts, first, bucket_s = self.starts, self.first, self.bucket_s
        ends = [s.end + SLACK_S for s in self.spans]
        last = [b - 1 for b in [*first[1:], self.n_buckets]]

        def bucket(t: float) -> int:
            i = bisect_right(starts, t) - 1
            if i < 0 or t > ends[i]:
                return -1
            return min(last[i], first[i] + int((t - starts[i]) / bucket_s[i]))

        return bucket

    def buckets(self) -> list[Bucket]:
        """Every bucket, in time order."""
        if self._buckets is not None:
            return self._buckets
        out = []
        for i, span in enumerate(self.spans):
            n = (self.first[i + 1] if i + 1 < len(self.first) else self.n_buckets) - self.first[i]
            for k in range(n):
                t0 = span.start + k * self.bucket_s[i]
                t1 = min(span.end, t0 + self.bucket_s[i])
                closing = k == n - 1
                out.append(
                    Bucket(
                        i,
                        t0,
                        span.end + SLACK_S if closing else t1,
                        closing,
                        max(t1 - t0, 1.0),
                        self.x(t0),
                        self.x0[i] + self.widths[i] if closing else self.x(t1),
                    )
                )
        self._buckets = out
        return out

    def count(self, times: Sequence[float]) -> list[float]:
        """How many of these (sorted) times fall in each bucket."""
        return [
            float(
                (bisect_right(times, b.until) if b.closing else bisect_left(times, b.until))
                - bisect_left(times, b.start)
            )
            for b in self.buckets()
        ]

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) of clock-aligned ticks in every span, about one per 90 px, none where
        its label would touch the previous one; over several days, each span's first tick
        says the date."""
        out: list[tuple[float, str]] = []
        days = utc(self.spans[0].start, "%d") != utc(self.spans[-1].end, "%d")
        for i, span in enumerate(self.spans):
            d = max(span.end - span.start, 1e-3)
            step = time_step(d / max(1.0, self.widths[i] / 90))
            fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
            t = math.ceil(span.start / step) * step
            first = True
            while t <= span.end:
                x = self.x(t)
                label = utc(t, f"%m-%d {fmt}" if days and first and step < 86400 else fmt)
                # About 6 px a character at 11 px: half of each label on either side.
                if not out or x - out[-1][0] >= 3.2 * (len(out[-1][1]) + len(label)) + 8:
                    out.append((x, label))
                    first = False
                t += step
        return out

    def gaps(self) -> list[tuple[float, float, float]]:
        """(x where the gap starts, x where it ends, seconds left out) between spans."""
        return [
            (self.x0[i] + self.widths[i], self.x0[i + 1], self.spans[i + 1].start - s.end)
            for i, s in enumerate(self.spans[:-1])
        ]

    def title(self) -> str:
        first = utc(self.spans[0].start, "%Y-%m-%d")
        last = utc(self.spans[-1].end, "%Y-%m-%d")
        days = first if first == last else f"{first} to {last}"
        cut = ", time between runs left out (//)" if len(self.spans) > 1 else ""
        return f"time, UTC ({days}){cut}"


# ---------------------------------------------------------------- SVG


def _f(v: float) -> str:
    return f"{v:.1f}"


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


@dataclass(frozen=True, slots=True)
class Plot:
    """An SVG canvas with margins for tick labels and axis titles; ymax is the axis top."""

    width: int
    height: int
    ymax: float = 1.0
    left: int = 64
    right: int = 16
    top: int = 30
    bottom: int = 40

    @property
    def pw(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def ph(self) -> float:
        return float(self.height - self.top - self.bottom)

    def y(self, v: float) -> float:
        return self.top + self.ph - min(v, self.ymax) / self.ymax * self.ph

    def xa(self, x: float) -> float:
        """A plot-area x (0 at the y axis) on the canvas."""
        return self.left + x


def _frame(
    plot: Plot,
    yticks: list[float],
    y_title: str,
    x_ticks: list[tuple[float, str]],
    x_title: str,
    body: list[str],
    name: str,
    prefix: str = "",
) -> str:
    """Gridlines, tick labels and axis titles around `body` (drawn in canvas coordinates)."""
    step = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    parts = [
        f'<svg class="chart" data-chart="{_esc(name)}" viewBox="0 0 {plot.width} {plot.height}" '
        f'width="{plot.width}" height="{plot.height}" role="img" '
        f'aria-label="{_esc(name)}">'
    ]
    x_end = plot.left + plot.pw
    for v in yticks:
        y = _f(plot.y(v))
        parts.append(f'<line class="grid" x1="{plot.left}" x2="{_f(x_end)}" y1="{y}" y2="{y}"/>')
        parts.append(
            f'<text class="tick y" x="{plot.left - 6}" y="{y}" dy="4" text-anchor="end">'
            f"{_esc(fmt_tick(v, step, prefix))}</text>"
        )
    base = _f(plot.top + plot.ph)
    for x, label in x_ticks:
        xs = _f(plot.xa(x))
        # A label at an end of the axis is kept inside the canvas (about 6.5 px a character).
        half = 3.3 * len(label)
        anchor = "end" if x + half > plot.pw + plot.right else "middle"
        anchor = "start" if x - half < -plot.left else anchor
        parts.append(
            f'<line class="grid" x1="{xs}" x2="{xs}" y1="{plot.top}" y2="{base}"/>'
            f'<text class="tick x" x="{xs}" y="{_f(plot.top + plot.ph + 15)}" '
            f'text-anchor="{anchor}">{_esc(label)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{plot.left}" x2="{_f(x_end)}" y1="{base}" y2="{base}"/>'
        f'<line class="axis" x1="{plot.left}" x2="{plot.left}" y1="{plot.top}" y2="{base}"/>'
    )
    parts.extend(body)
    mid_y = _f(plot.top + plot.ph / 2)
    parts.append(
        f'<text class="title y" transform="translate(14 {mid_y}) rotate(-90)" '
        f'text-anchor="middle">{_esc(y_title)}</text>'
        f'<text class="title x" x="{_f(plot.left + plot.pw / 2)}" y="{plot.height - 6}" '
        f'text-anchor="middle">{_esc(x_title)}</text></svg>'
    )
    return "".join(parts)


def _steps(
    axis: TimeAxis,
    plot: Plot,
    values: Sequence[float | None],
    color: str,
    dash: str = "",
    cls: str = "series",
) -> str:
    """A step line over the buckets; None (no data) and the gaps between spans break it."""
    d: list[str] = []
    prev_span, open_ = -1, False
    for b, v in zip(axis.buckets(), values, strict=True):
        if v is None:
            open_ = False
            continue
        y = _f(plot.y(v))
        if not open_ or b.span != prev_span:
            d.append(f"M{_f(plot.xa(b.x0))},{y}")
        else:
            d.append(f"V{y}")
        d.append(f"H{_f(plot.xa(b.x1))}")
        prev_span, open_ = b.span, True
    if not d:
        return ""
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<path class="{cls}" d="{"".join(d)}" fill="none" stroke="{color}" '
        f'stroke-width="1.6"{dash_attr}/>'
    )


def _time_marks(axis: TimeAxis, plot: Plot, runs: list[RunRecord], labels: list[str]) -> list[str]:
    """The breaks between spans (shaded, with a double slash on the axis) and a labelled
    line at each run's start."""
    out: list[str] = []
    top, base = plot.top, plot.top + plot.ph
    for x0, x1, secs in axis.gaps():
        a, b = plot.xa(x0), plot.xa(x1)
        out.append(
            f'<g class="gap"><title>{_esc(fmt_duration(secs))} between runs, left out</title>'
            f'<rect x="{_f(a)}" y="{top}" width="{_f(b - a)}" height="{_f(plot.ph)}"/>'
            f'<path d="M{_f(a + 2)},{_f(base + 5)}l4,-10M{_f(a + 7)},{_f(base + 5)}l4,-10"/></g>'
        )
    for k, (run, label) in enumerate(zip(runs, labels, strict=True)):
        x = _f(plot.xa(axis.x(run.started_at)))
        y = 11 if k % 2 == 0 else 23
        out.append(
            f'<line class="run-start" data-run="{_esc(label)}" x1="{x}" x2="{x}" y1="{y + 3}" '
            f'y2="{_f(base)}"><title>{_esc(label)} started {utc(run.started_at)} UTC</title>'
            f'</line><text class="run-label" x="{x}" dx="3" y="{y}">{_esc(label)}</text>'
        )
    return out


def _legend(items: list[tuple[str, str, str]]) -> str:
    """(label, colour, line style: solid/dashed/dotted) as HTML under a chart title."""
    if not items:
        return ""
    spans = "".join(
        f'<span><i style="border-top:2px {style} {color}"></i>{_esc(label)}</span>'
        for label, color, style in items
    )
    return f"<div class=legend>{spans}</div>"


def _time_chart(
    name: str,
    axis: TimeAxis,
    job: JobFacts,
    labels: list[str],
    series: list[tuple[Sequence[float | None], str, str]],
    y_title: str,
    width: int,
    height: int = 230,
    extra_top: float = 0.0,
    extra: Callable[[Plot], list[str]] | None = None,
    prefix: str = "",
) -> str:
    """Series (values per bucket, colour, dash) on the time axis, with run marks."""
    top = max([extra_top] + [v for s, _, _ in series for v in s if v is not None])
    yticks = nice_ticks(top * 1.04 if top > 0 else 1.0)
    plot = Plot(width, height, ymax=yticks[-1])
    body = _time_marks(axis, plot, job.runs, labels)
    body.extend(_steps(axis, plot, v, color, dash) for v, color, dash in series)
    if extra is not None:
        body.extend(extra(plot))
    return _frame(plot, yticks, y_title, axis.ticks(), axis.title(), body, name, prefix)


def _rates(counts: list[float], axis: TimeAxis, per_s: float) -> list[float | None]:
    return [c / b.seconds * per_s for c, b in zip(counts, axis.buckets(), strict=True)]


# ---------------------------------------------------------------- job-level sections

JOB_WIDTH = 1180


def _job_charts(job: JobFacts, spans: list[Span]) -> str:
    if not spans:
        return "<p class=dim>nothing happened yet: no answers, attempts or charges</p>"
    axis = TimeAxis.build(spans, Plot(JOB_WIDTH, 1).pw)
    labels = run_labels(job.runs)
    blocks: list[str] = []

    def block(title: str, legend: str, svg: str) -> None:
        blocks.append(f"<div class=chartbox><h3>{_esc(title)}</h3>{legend}{svg}</div>")

    answers = _rates(axis.count(job.answers), axis, 1.0)
    block(
        "answers per second",
        "",
        _time_chart(
            "answers", axis, job, labels, [(answers, PALETTE[0], "")], "answers/s", JOB_WIDTH
        ),
    )

    lanes = sorted({p.lane for p in job.timeline})
    if lanes:
        bucket = axis.counter()
        n = axis.n_buckets
        sums = {lane: ([0.0] * n, [0.0] * n, [0.0] * n, [0] * n) for lane in lanes}
        for p in job.timeline:
            b = bucket(p.t)
            if b < 0:
                continue
            fl, lim, conc, cnt = sums[p.lane]
            fl[b] += p.in_flight
            lim[b] += p.limit
            conc[b] = max(conc[b], p.concurrency)
            cnt[b] += 1
        series: list[tuple[Sequence[float | None], str, str]] = []
        legend = []
        for k, lane in enumerate(lanes):
            fl, lim, conc, cnt = sums[lane]
            color = PALETTE[k % len(PALETTE)]
            series.append(([f / c if c else None for f, c in zip(fl, cnt, strict=True)], color, ""))
            series.append(
                ([v / c if c else None for v, c in zip(lim, cnt, strict=True)], color, "6 3")
            )
            series.append(
                ([v if c else None for v, c in zip(conc, cnt, strict=True)], color, "1 3")
            )
            legend += [
                (f"{lane}: in flight", color, "solid"),
                (f"{lane}: adaptive limit", color, "dashed"),
                (f"{lane}: concurrency", color, "dotted"),
            ]
        block(
            "requests in flight against each lane's adaptive limit (means over each step)",
            _legend(legend),
            _time_chart("in-flight", axis, job, labels, series, "requests", JOB_WIDTH),
        )
    else:
        block(
            "requests in flight",
            "",
            "<p class=dim>no timeline: this state.db was written by a regen that did not "
            "sample lanes (or no run has started since)</p>",
        )

    # Dollars spent, cumulative, against each run's cap.
    spent: list[float | None] = [job.spent_by(b.until) for b in axis.buckets()]
    caps = [(r, r.max_cost_usd) for r in job.runs if r.max_cost_usd is not None]

    def cap_lines(plot: Plot) -> list[str]:
        out = []
        for r, cap in caps:
            assert cap is not None
            x0 = plot.xa(axis.x(r.started_at))
            i = axis._span_of(r.started_at)
            x1 = plot.xa(axis.x0[i] + axis.widths[i])
            y = _f(plot.y(cap))
            out.append(
                f'<line class="cap" x1="{_f(x0)}" x2="{_f(x1)}" y1="{y}" y2="{y}">'
                f"<title>dollar cap ${cap:,.2f}</title></line>"
                f'<text class="cap-label" x="{_f(x1 - 3)}" y="{y}" dy="-4" '
                f'text-anchor="end">cap ${cap:,.2f}</text>'
            )
        return out

    block(
        "dollars spent (cumulative) against the job's dollar cap",
        _legend([("spent", PALETTE[1], "solid")] + ([("cap", "#c22", "dashed")] if caps else [])),
        _time_chart(
            "spend",
            axis,
            job,
            labels,
            [(spent, PALETTE[1], "")],
            "USD spent (cumulative)",
            JOB_WIDTH,
            extra_top=max((c for _, c in caps if c is not None), default=0.0),
            extra=cap_lines,
            prefix="$",
        ),
    )

    classes = sorted({c for _, c, _ in job.failures})
    if classes:
        color_of = {c: PALETTE[(k + 2) % len(PALETTE)] for k, c in enumerate(classes)}
        by_class = {c: array("d") for c in classes}
        for t, c, _ in job.failures:
            by_class[c].append(t)
        series = [(_rates(axis.count(by_class[c]), axis, 60.0), color_of[c], "") for c in classes]
        block(
            "failed attempts by class",
            _legend([(c, color_of[c], "solid") for c in classes]),
            _time_chart("errors", axis, job, labels, series, "failed attempts/min", JOB_WIDTH),
        )
    else:
        block("failed attempts by class", "", "<p class=dim>no failed attempts</p>")

    limited_lanes = sorted({lane or "" for _, lane in job.rate_limited})
    if limited_lanes:
        color_of = {lane: PALETTE[k % len(PALETTE)] for k, lane in enumerate(limited_lanes)}
        by_lane = {lane: array("d") for lane in limited_lanes}
        for t, lane_or_none in job.rate_limited:
            by_lane[lane_or_none or ""].append(t)
        series = [
            (_rates(axis.count(by_lane[lane]), axis, 60.0), color_of[lane], "")
            for lane in limited_lanes
        ]
        block(
            "429s (rate limited), by lane",
            _legend(
                [(lane or "(lane not recorded)", color_of[lane], "solid") for lane in limited_lanes]
            ),
            _time_chart("429s", axis, job, labels, series, "429s/min", JOB_WIDTH),
        )
    else:
        block("429s (rate limited)", "", "<p class=dim>no 429s</p>")
    return "".join(blocks)


def _runs_table(job: JobFacts) -> str:
    if not job.runs:
        return ""
    rows = []
    for r, label, answers, usd, last in zip(
        job.runs, run_labels(job.runs), job.run_answers, job.run_usd, job.run_last, strict=True
    ):
        end = r.ended_at if r.ended_at is not None else last
        lanes = ", ".join(
            f"{name} ({cfg.get('max_tokens')} tok, x{cfg.get('concurrency')})"
            for name, cfg in sorted(r.lanes.items())
        )
        rows.append(
            (
                label,
                utc(r.started_at) + " UTC",
                fmt_duration(max(0.0, end - r.started_at)),
                f"{answers:,}",
                f"${usd:,.4f}",
                "-" if r.max_cost_usd is None else f"${r.max_cost_usd:,.2f}",
                lanes,
                r.stop_reason or ("(killed)" if r.ended_at is None else "done"),
            )
        )
    return _table(
        rows,
        ("run", "started", "lasted", "answers", "spent", "cap", "lanes", "stopped"),
        cls="runs",
    )


def _lanes_table(job: JobFacts, datasets: list[DatasetReport]) -> str:
    if not job.recorded:
        return ""
    config: dict[str, dict[str, object]] = {}
    for run in job.runs:  # the latest run's settings win
        config.update(run.lanes)
    answered: dict[str | None, int] = {}
    escalated: dict[str | None, int] = {}
    for r in datasets:
        for (lane, esc), n in r.lanes.items():
            answered[lane] = answered.get(lane, 0) + n
            if esc:
                escalated[lane] = escalated.get(lane, 0) + n
    names: list[str | None] = list(config)
    names += sorted(
        {n for n in (*answered, *job.lane_attempts) if n not in config}, key=lambda n: n or ""
    )
    if not names:
        return ""
    rows = []
    for name in names:
        cfg = config.get(name or "", {})
        rows.append(
            (
                name or "(not recorded)",
                str(cfg.get("max_tokens", "-")),
                str(cfg.get("concurrency", "-")),
                str(cfg.get("escalate_to") or "-"),
                f"{answered.get(name, 0):,}",
                f"{escalated.get(name, 0):,}",
                f"{job.lane_attempts.get(name, 0):,}",
                f"{job.lane_429s.get(name, 0):,}",
            )
        )
    table = _table(
        rows,
        (
            "lane",
            "max_tokens",
            "concurrency",
            "escalates to",
            "answers",
            "of which escalated here",
            "attempts",
            "429s",
        ),
        cls="lanes",
    )
    note = (
        f"<p class=escalations>{job.escalated_charges:,} truncated answers were escalated "
        f"(re-sent on a longer lane; ${job.escalated_usd:,.4f} paid for the truncated ones); "
        f"{sum(escalated.values()):,} of them are answered.</p>"
    )
    return table + note


def _job_section(report: Report) -> str:
    job = report.job
    spans = activity_spans(job)
    note = ""
    if not job.recorded:
        note = (
            "<p class=note>This state.db was written by a regen that did not record runs: "
            "the charts below come from answers, failed attempts and charges alone (no run "
            "marks, caps, lanes or in-flight timeline); stretches over "
            f"{IDLE_GAP_S / 60:.0f} minutes with nothing happening are left out.</p>"
        )
    elif not job.runs:
        note = "<p class=note>No runs recorded yet.</p>"
    return (
        f"<section class=job>{note}{_runs_table(job)}"
        f"<h3>lanes</h3>{_lanes_table(job, report.datasets) or '<p class=dim>none recorded</p>'}"
        f"{_job_charts(job, spans)}</section>"
    )


# ---------------------------------------------------------------- per dataset

DS_WIDTH = 580


def _histogram(values: Sequence[int], markers: list[tuple[str, int]]) -> str:
    """Completion lengths in 1-2-5-wide bins from 0, with a labelled line at each lane's
    max_tokens: a pile-up against one means answers cut short."""
    if not values:
        return "<p class=dim>no answers</p>"
    hi = float(max(max(values), max((m for _, m in markers), default=0)))
    bw = max(1.0, nice_step(hi, 40))
    counts = [0] * (int(hi // bw) + 1)
    for v in values:
        counts[int(v // bw)] += 1
    xticks_v = nice_ticks(len(counts) * bw, 6)
    xmax = xticks_v[-1]
    yticks = nice_ticks(max(counts) * 1.04, whole=True)
    plot = Plot(DS_WIDTH, 220, ymax=yticks[-1])
    sx = plot.pw / xmax
    base = plot.top + plot.ph
    body = [
        f'<rect class="bar" x="{_f(plot.xa(i * bw * sx))}" y="{_f(plot.y(c))}" '
        f'width="{_f(max(0.5, bw * sx - 1))}" height="{_f(base - plot.y(c))}">'
        f"<title>{i * bw:,.0f}-{(i + 1) * bw:,.0f} tokens: {c:,}</title></rect>"
        for i, c in enumerate(counts)
        if c
    ]
    for k, (lane, mt) in enumerate(sorted(markers, key=lambda m: m[1])):
        x = _f(plot.xa(mt * sx))
        y = 11 if k % 2 == 0 else 23
        at = sum(1 for v in values if v >= mt)
        body.append(
            f'<line class="max-tokens" data-lane="{_esc(lane)}" x1="{x}" x2="{x}" y1="{y + 3}" '
            f'y2="{_f(base)}"><title>{_esc(lane)}: max_tokens {mt:,} ({at:,} answers at or '
            f"over it)</title></line>"
            f'<text class="max-label" x="{x}" dx="3" y="{y}">{_esc(lane)} {mt:,}</text>'
        )
    step = xticks_v[1] - xticks_v[0]
    x_ticks = [(v * sx, fmt_tick(v, step)) for v in xticks_v]
    return _frame(plot, yticks, "answers", x_ticks, "completion tokens", body, "lengths")


def _markers(r: DatasetReport, runs: list[RunRecord]) -> list[tuple[str, int]]:
    """(lane, max_tokens) of the lanes that served this dataset and those its truncated
    answers escalate to or from, as each run had them; all lanes when none is known."""
    served = {lane for lane, _ in r.lanes if lane}
    out: dict[tuple[str, int], None] = {}
    for run in runs:
        targets = {cfg.get("escalate_to") for name, cfg in run.lanes.items() if name in served}
        for name, cfg in run.lanes.items():
            mt = cfg.get("max_tokens")
            near = not served or name in served or name in targets
            near = near or cfg.get("escalate_to") in served
            if isinstance(mt, int) and near:
                out[(name, mt)] = None
    return list(out)


def _throughput(r: DatasetReport, axis: TimeAxis | None, job: JobFacts) -> str:
    if axis is None or len(r.finished_at) < 2:
        return "<p class=dim>not enough answers for a curve</p>"
    per_min = _rates(axis.count(r.finished_at), axis, 60.0)
    return _time_chart(
        "throughput",
        axis,
        job,
        run_labels(job.runs),
        [(per_min, PALETTE[0], "")],
        "answers/min",
        DS_WIDTH,
        height=220,
    )


def _table(rows: Sequence[tuple[str, ...]], head: tuple[str, ...], cls: str = "") -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{header}</tr></thead><tbody>{cells}</tbody></table>"


def _counts(d: dict[str, int]) -> str:
    if not d:
        return "<p class=dim>none</p>"
    total = sum(d.values())
    rows = [(k, f"{n:,}", f"{n / total:.1%}") for k, n in sorted(d.items(), key=lambda kv: -kv[1])]
    return _table(rows, ("", "count", "share"))


def _dataset_lanes(r: DatasetReport) -> str:
    if not r.lanes:
        return ""
    lanes = sorted({lane for lane, _ in r.lanes}, key=lambda n: n or "")
    rows = [
        (
            lane or "(not recorded)",
            f"{r.lanes.get((lane, False), 0) + r.lanes.get((lane, True), 0):,}",
            f"{r.lanes.get((lane, True), 0):,}",
        )
        for lane in lanes
    ]
    return (
        "<h3>lanes</h3>"
        + _table(rows, ("lane", "answers", "of which escalated here"), cls="ds-lanes")
        + f"<p>{r.escalated_charges:,} truncated answers escalated</p>"
    )


def _section(r: DatasetReport, axis: TimeAxis | None, job: JobFacts) -> str:
    p = r.progress
    lat = sorted(r.latencies)
    summary = _table(
        [
            (
                f"{p.items:,}",
                f"{p.done:,}",
                f"{p.failed:,}",
                f"{p.pending:,}",
                f"{p.bad_rows:,}",
                f"{p.prompt_tokens:,}",
                f"{p.completion_tokens:,}",
                f"${p.cost_usd:,.4f}",
                f"${per_mtok(p.cost_usd, p.completion_tokens):,.2f}",
            )
        ],
        (
            "items",
            "done",
            "failed",
            "pending",
            "bad rows",
            "prompt tok",
            "completion tok",
            "cost",
            "$/Mtok",
        ),
    )
    latency = _table(
        [tuple(f"{percentile(lat, q):.2f} s" for q in (0.5, 0.9, 0.99)) + (f"{lat[-1]:.2f} s",)]
        if lat
        else [("-", "-", "-", "-")],
        ("p50", "p90", "p99", "max"),
    )
    hist = _histogram(r.completion_tokens, _markers(r, job.runs))
    return f"""
<section>
<h2>{html.escape(p.name)}</h2>
{summary}
<div class=grid>
<div><h3>throughput (answers per minute)</h3>{_throughput(r, axis, job)}</div>
<div><h3>completion length (tokens), marked at each lane's max_tokens</h3>{hist}</div>
<div><h3>latency of answers</h3>{latency}<h3>finish reasons</h3>{_counts(r.finish_reasons)}
{_dataset_lanes(r)}</div>
<div><h3>providers that served</h3>{_counts(r.providers)}
<h3>failed attempts by class</h3>{_counts(r.errors)}</div>
</div>
</section>"""


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1240px}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:right}th{background:#f3f3f3}.dim{color:#888}.note{background:#fff6d6;padding:.4em .8em}
svg.chart{max-width:100%;height:auto;display:block}svg text{fill:#444;font-size:11px}
svg .grid{stroke:#e4e4e4}svg .axis{stroke:#888}svg .title{fill:#222;font-size:12px}
svg .bar{fill:#2a7}svg .gap rect{fill:#f2f2f2}svg .gap path{stroke:#666;fill:none}
svg .run-start{stroke:#333;stroke-dasharray:3 2}svg .run-label{font-weight:600;fill:#222}
svg .cap{stroke:#c22;stroke-dasharray:6 3;stroke-width:1.5}svg .cap-label{fill:#c22}
svg .max-tokens{stroke:#c22;stroke-dasharray:4 2;stroke-width:1.5}svg .max-label{fill:#c22}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em}
h3{font-size:13px;margin:.8em 0 .2em}section{border-top:2px solid #ddd;margin-top:1.5em}
.legend span{margin-right:1.2em;font-size:12px;white-space:nowrap}
.legend i{display:inline-block;width:22px;margin-right:4px;vertical-align:middle}
"""


def render(out_dir: Path, report: Report) -> str:
    reports = report.datasets
    total_cost = sum(r.progress.cost_usd for r in reports)
    total_tokens = sum(r.progress.completion_tokens for r in reports)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    overview = _table(
        [
            (
                r.progress.name,
                f"{r.progress.done:,}/{r.progress.items:,}",
                f"{r.progress.failed:,}",
                f"{r.progress.completion_tokens:,}",
                f"${r.progress.cost_usd:,.4f}",
            )
            for r in reports
        ],
        ("dataset", "done/items", "failed", "completion tok", "cost"),
    )
    spans = activity_spans(report.job)
    plot = Plot(DS_WIDTH, 1)
    axis = TimeAxis.build(spans, plot.pw) if spans else None
    body = "".join(_section(r, axis, report.job) for r in reports)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>regen report: {html.escape(out_dir.name)}</title><style>{STYLE}</style></head>
<body><h1>regen report</h1>
<p>{html.escape(str(out_dir))} &middot; written {when} by regen {__version__} &middot;
${total_cost:,.4f} spent on {total_tokens:,} completion tokens</p>
{overview}{_job_section(report)}{body}
</body></html>
"""


def write_report(out_dir: Path, to: Path | None = None) -> Path:
    """Write the report (atomically) and return its path."""
    store = Store.open_readonly(out_dir)
    try:
        page = render(out_dir, gather(store))
    finally:
        store.close()
    path = to or out_dir / "report.html"
    try:
        write_text_atomic(path, page)
    except OSError as exc:
        raise StateError(f"{path}: cannot write the report: {exc}") from exc
    return path
