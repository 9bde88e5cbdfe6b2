"""Axes: nice 1-2-5 ticks, and the broken time axis that leaves out the time between runs.

`TimeAxis` lays the activity spans side by side, cuts each into clock-friendly buckets that
every series is counted into, and says where its ticks, labels and gaps fall. Kept apart
from the SVG so the arithmetic can be read (and tested) without the markup.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from regen.outputs.report.data import SLACK_S, JobFacts

IDLE_GAP_S = 600.0
"""Without a record of runs, a stretch this long with nothing happening is cut from the axis."""


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


def fmt_step(s: float) -> str:
    """A clock-friendly step as people say it: `5 s`, `1 min`, `2 h`."""
    if s < 60:
        return f"{s:g} s"
    return f"{s / 60:g} min" if s < 3600 else f"{s / 3600:g} h"


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
RATE_STEP_S = 60.0
"""The shortest step a rate is counted over: one event in a step of a second would read as
60 a minute, so rates and shares are counted over a minute or more."""


@dataclass
class TimeAxis:
    """Spans laid side by side across `width` pixels, each cut into buckets of whole seconds
    (a clock-friendly step) that the series are counted into. A span's last bucket takes the
    remainder: between half a step and one and a half, so that no sliver of a bucket at a
    run's end turns a few events into a spike."""

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
    def build(cls, spans: list[Span], width: float, min_step_s: float = 1.0) -> TimeAxis:
        """The axis, its steps no shorter than `min_step_s` (RATE_STEP_S for rates)."""
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
            step = time_step(max(min_step_s, d / max(1, int(w / BUCKET_PX))))
            x0.append(x)
            first.append(b)
            bucket_s.append(step)
            x += w + GAP_PX
            b += max(1, int(d / step + 0.5))
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
                closing = k == n - 1
                t1 = span.end if closing else t0 + self.bucket_s[i]
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

    def count(self, times: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
        """How many of these (sorted) times fall in each bucket; with `weights` (one per
        time), their sum instead (tokens of the answers that finished in it)."""
        cum = [0.0, *itertools.accumulate(weights)] if weights is not None else None
        out = []
        for b in self.buckets():
            hi = bisect_right(times, b.until) if b.closing else bisect_left(times, b.until)
            lo = bisect_left(times, b.start)
            out.append(float(hi - lo) if cum is None else cum[hi] - cum[lo])
        return out

    def steps(self) -> str:
        """What the buckets are, for a chart's title: `1 min`, or `1 min to 5 min`."""
        lo, hi = min(self.bucket_s), max(self.bucket_s)
        return fmt_step(lo) if lo == hi else f"{fmt_step(lo)} to {fmt_step(hi)}"

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) of clock-aligned ticks in every span, about one per 90 px, none where
        its label would touch the previous one; over several days, each span's first tick
        says the date. A span too short to hold an aligned tick (a pilot of half a second)
        gets one at its start."""
        out: list[tuple[float, str]] = []
        days = utc(self.spans[0].start, "%d") != utc(self.spans[-1].end, "%d")
        for i, span in enumerate(self.spans):
            d = max(span.end - span.start, 1e-3)
            step = time_step(d / max(1.0, self.widths[i] / 90))
            fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
            t = math.ceil(span.start / step) * step
            t = t if t <= span.end else span.start
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
