"""An honest ETA: remaining work from the observed latencies, over the concurrency achieved.

Items go out in a seeded random order, so the answers seen so far are a fair sample of a
dataset, but not a fair sample of *latencies*: early on, the long answers are still in flight
and the finished ones are the short ones. The latency distribution is therefore estimated with
Kaplan-Meier, counting the requests on the wire as censored at their age so far, which removes
that bias. Then, per lane (lanes run side by side, and within a lane datasets go in order):

    time left = sum over its datasets of (items left x mean time on the wire per item)
                / mean requests on the wire + the mean residual time of the last ones

"Items left" is the smaller of the items pending and what the dataset's token budget or dollar
cap still allows at the observed tokens and cost per item. The interval (p10-p90) combines the
uncertainty of each mean (its standard error, shrinking as answers come), the spread of the
remaining items' own times, and how much the achieved concurrency varied lately.
"""

from __future__ import annotations

import itertools
import math
import random
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TypeVar

from regen.measures import format_duration as format_duration  # view/, run/ import it here

NORMAL = NormalDist()
"""The standard normal, whose quantiles the ETA's intervals and tail fits read."""
Z90 = NORMAL.inv_cdf(0.9)
"""The standard normal's 90th percentile: p10 and p90 are the mean -/+ Z90 sd."""
DRAIN_RSD = 0.35
SD_SCALE = 1.3
"""The sum of the modelled spreads falls short of the errors seen on simulated runs
(bench/eta_model.py): slots are not perfectly packed, nor answers independent of when they
started. Scaled so that p10-p90 holds the actual time about four times in five."""
RESERVOIR = 4096
"""Latencies (and priced answers) kept per flow: enough for the distribution, bounded for
memory and time."""
T = TypeVar("T")
MIN_SAMPLE = 5
"""Fewer finished answers than this in a lane and dataset: use the lane's pooled answers."""
UNMEASURED_RSD = 1.0
"""The relative sd Concurrency.mean gives a pace it has not measured yet: lane_eta reads it
as such (its ETA is then `prior`)."""
EARLIER_RSD = 0.12
"""How far this run's pace (its mean requests on the wire) may be from the one an earlier run
measured, or from a lane's limit before its own is measured: a pilot starts cold, the
machine's load and the provider's speed move."""
EARLIER_DRIFT = 0.06
"""How far a dataset's answer times in a lane may move between an earlier run (a pilot) and
this one beyond the earlier mean's own error (`Flow.earlier_rse`), each dataset on its own (a
pilot that ran it cold, or beside other datasets, or under another load). Measured by
bench/pilot_drift.py on 61 pilot and run flows of bench/plan.py's and bench/realistic.py's
jobs (seeds 1-3): 5.8% makes the pilot's p10-p90 hold the run's mean four times in five."""
EARLIER_SHIFT = 0.03
"""The part of that move common to all of a lane's datasets (a provider or machine slower for
all): the same measurement found each job's flows off by a mean of -3% (bench/plan.py) and +3%
(bench/realistic.py), with no spread between jobs beyond the datasets' own parts."""
FILL_S = 5.0
"""A lane not yet full after this long is measured as it is (fed slowly, or few items)."""
RUN_ANSWERS = 20
"""Answers a lane needs (this run's, or earlier runs' such as a pilot's) before its ETA
stops being `prior`."""


def keep(sample: MutableSequence[T], seen: int, value: T, rng: random.Random) -> int | None:
    """Add the `seen`-th value to a uniform sample of at most RESERVOIR (reservoir sampling):
    all of them up to that size, then each with the chance to replace one of it. Where it
    went (None: not kept), for a sample kept beside it."""
    if len(sample) < RESERVOIR:
        sample.append(value)
        return len(sample) - 1
    k = rng.randrange(seen)
    if k < RESERVOIR:
        sample[k] = value
        return k
    return None


@dataclass
class Flow:
    """One dataset in one lane, during this run: what is left, and how long answers took."""

    remaining: int = 0
    """Items of this dataset in this lane not yet finished (done or failed)."""
    latencies: array[float] = field(default_factory=lambda: array("d"))
    """Time on the wire of successful attempts: all of them up to RESERVOIR, then a uniform
    sample of that size (items go out in random order, so it stays representative)."""
    answers: int = 0
    """Successful attempts seen (the reservoir's population)."""
    failed_wire_s: float = 0.0
    """Time on the wire of failed attempts: work that produced nothing, but took a slot."""
    on_wire: dict[int, float] = field(default_factory=dict)
    """Start times (monotonic) of the attempts on the wire now."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    cut_short: list[float] = field(default_factory=list)
    """How long the requests an earlier run left on the wire (killed) had run by its end: they
    lasted at least that long, and the longest answers are the ones a kill catches."""

    def censored(self, now: float) -> list[float]:
        """Times known only as lower bounds: the requests on the wire now, at their age, and
        those an earlier run was killed with."""
        return [now - t for t in self.on_wire.values()] + self.cut_short

    def add_latency(self, seconds: float, prompt_est: float | None = None) -> None:
        """An answer's time on the wire, with its item's estimated prompt tokens (None: not
        known; then no answer's prompt counts, `prompt_factor`)."""
        self.answers += 1
        at = keep(self.latencies, self.answers, seconds, self.rng)
        if prompt_est is None:
            self.timed_prompts = None
        elif at is not None and self.timed_prompts is not None:
            if at == len(self.timed_prompts):
                self.timed_prompts.append(float(prompt_est))
            else:
                self.timed_prompts[at] = float(prompt_est)

    timed_prompts: array[float] | None = field(default_factory=lambda: array("d"))
    """The estimated prompt tokens of each answer in `latencies` (None once an answer came
    without one)."""

    @property
    def mean_latency(self) -> float | None:
        """The mean of `latencies` (None: no answer yet)."""
        return sum(self.latencies) / len(self.latencies) if self.latencies else None

    wire_prompts: dict[int, float] = field(default_factory=dict)
    """The estimated prompt tokens of the attempts in `on_wire` (where known)."""

    def prompt_factor(self) -> float:
        """How much longer the items still to send take than those started so far, by their
        estimated prompts (`Stat.regressed` over the answers, as the pilot's answers are
        scaled in `start_from`): where answer lengths follow prompt lengths, a flow whose
        first items in this run happened to draw short prompts (29 of its first 30, on
        bench/plan.py's capacity workload) would otherwise make its ETA short until the rest
        come. Measured from the items started (answered and on the wire), whose times the
        latency curve stands for, not from the answers alone: those on the wire are the long
        ones. 1.0 where the prompts are not known or do not move the times."""
        return self._prompt_fit()[0]

    def prompt_spread(self) -> float:
        """How much of an answer's spread in time is left once its prompt is known: the
        error of the mean adjusted to the prompts to come over that of the plain mean (both
        `Stat`'s). The time of the items to come is their mean at their own prompts, so its
        error, and each item's spread about it, is what the prompts leave; where answer
        lengths follow prompt lengths it is well below one. 1.0 where the prompts are not
        known or do not move the times (nothing is narrowed that the answers do not show)."""
        return self._prompt_fit()[1]

    def _prompt_fit(self) -> tuple[float, float]:
        """`prompt_factor` and `prompt_spread`, from one regression over the answers."""
        prompts, to = self.timed_prompts, self.prompt_to_come
        if prompts is None or to is None or len(prompts) < REGRESS_MIN:
            return 1.0, 1.0
        started = (sum(prompts) + sum(self.wire_prompts.values())) / (
            len(prompts) + len(self.wire_prompts)
        )
        last = self._prompt_factor
        # Worked out again once the answers or the prompts moved by a percent or two.
        if (
            last is None
            or self.answers > last[0] * 1.02 + 1
            or abs(to - last[1]) > 0.01 * last[1]
            or abs(started - last[2]) > 0.01 * last[2]
        ):
            times = list(self.latencies)
            there = Stat.regressed(times, list(prompts), started).mean
            fit = Stat.regressed(times, list(prompts), to)
            factor = fit.mean / there if there > 0 else 1.0
            plain = Stat.of(times).se
            spread = min(1.0, fit.se / plain) if plain > 0 else 1.0
            last = self._prompt_factor = (self.answers, to, started, factor, spread)
        return last[3], last[4]

    _prompt_factor: tuple[int, float, float, float, float] | None = None
    """The last `_prompt_fit`: the answers, the prompts to come and started it was for, and
    the factor and the spread."""

    def start_from(self, answers: Sequence[tuple[float, int]], items: int, prompts: int) -> None:
        """Earlier runs' answers (a pilot's), newest first as (time on the wire, estimated
        prompt tokens), start the flow's latencies, so that its ETA rests on its own times
        from the start; scaled as `regen plan` adjusts its means, to the prompts of the
        `items` still to come (`prompts` estimated tokens in all): a pilot of 30 that drew
        long prompts would otherwise say so for the whole run's start. The adjustment is
        `prompt_factor`'s, over these answers and the run's alike."""
        times = [t for t, _ in answers]
        to = prompts / items if items else None
        scale = Stat.regressed(times, [float(x) for _, x in answers], to)
        for seconds, prompt in reversed(answers):
            self.add_latency(seconds, prompt)
        if to is not None:
            self.prompt_to_come = to  # until the run's ETA sets it again
        self.earlier_n = len(times)
        self.earlier_rse = scale.se / scale.mean if scale.mean > 0 else None

    earlier_n: int = 0
    """Latencies that came from earlier runs' answers (`start_from`)."""
    earlier_rse: float | None = None
    """Their mean's relative error as `Stat.regressed` measures it: skewed times from few
    answers (Cox), and the prompt sizes accounted for (where answer lengths follow prompt
    lengths, a mean adjusted to the prompts to come is known better than the plain one)."""

    def mean_errors(self, model: LatencyModel) -> tuple[float, float]:
        """The standard error of the flow's own model's mean, in two parts: what its earlier
        runs' answers bring (their `earlier_rse`) and what this run's do (the spread of one
        that their prompts leave, `prompt_spread`, over their number), each weighted by its
        share of the answers."""
        n = max(model.n, 1)
        earlier = min(self.earlier_n, n) if self.earlier_rse is not None else 0
        return (
            earlier * (self.earlier_rse or 0.0) * model.mean / n,
            math.sqrt(n - earlier) * model.sd * self.prompt_spread() / n,
        )

    tokens: int = 0
    """Tokens that count against the dataset's budget, over the answers finished this run."""
    cost_usd: float = 0.0
    finished: int = 0
    earlier_cost_usd: float = 0.0
    """What earlier runs' answers in this lane and dataset cost (a pilot's among them)."""
    earlier_tokens: int = 0
    """Of earlier runs' answers, the tokens that count against the dataset's budget."""

    def tokens_per_item(self) -> float | None:
        """The budget's tokens an answer uses: this run's answers', else earlier runs' (a
        pilot's); None: no answer yet."""
        if self.finished:
            return self.tokens / self.finished
        earlier = self.earlier_answers
        return self.earlier_tokens / earlier if earlier and self.earlier_tokens else None

    def usd_per_answer(self) -> float | None:
        """The dollars an answer cost: this run's answers', else earlier runs' (a pilot's);
        None: no answer yet (for a dollar budget's items left; `usd_per_item` prices the items
        to come at their prompts)."""
        if self.finished:
            return self.cost_usd / self.finished
        earlier = self.earlier_answers
        return self.earlier_cost_usd / earlier if earlier and self.earlier_cost_usd > 0 else None

    escalated: int = 0
    """Truncated answers sent on to a longer lane (`escalate_to`), this run and before."""
    answered: int = 0
    """Answers in this lane (escalated ones included), this run and before."""

    @property
    def earlier_answers(self) -> int:
        """Answers in this lane of earlier runs (their cost: `earlier_cost_usd`)."""
        return max(0, self.answered - self.finished)

    escalated_prompts: float = 0.0
    """The estimated prompt tokens of this run's escalated items, summed (over
    `escalated_timed` of them)."""
    escalated_timed: int = 0

    def escalated_prompt(self) -> float | None:
        """The mean estimated prompt of the items this flow sends on, from this run's (None:
        fewer than ESCALATED_MIN). A truncated answer is a long one, and where answers follow
        prompts its prompt is longer than the flow's mean (bench/plan.py's lanes workload:
        169 tokens against 98): the lane they go to must expect them at their own."""
        if self.escalated_timed < ESCALATED_MIN:
            return None
        return self.escalated_prompts / self.escalated_timed

    @property
    def escalation_share(self) -> float:
        """The share of this flow's answers that go on to a longer lane."""
        return self.escalated / self.answered if self.answered else 0.0

    coming_var: float = 0.0
    """The variance of the count of escalated items still to come into this flow (set with
    them, from the sending flow's share and how many answers it rests on)."""
    prompts_left: float = 0.0
    """The estimated prompt tokens of the items in `remaining`."""
    prompt_to_come: float | None = None
    """The mean estimated prompt of the items it will still send, the escalated ones still to
    come into it included (set with them; None: not known)."""
    priced: list[tuple[float, float]] = field(default_factory=list)
    """(estimated prompt tokens, dollars) of its answers, earlier runs' and this run's: all of
    them up to RESERVOIR, then a uniform sample of that size."""
    priced_n: int = 0
    """Answers seen for `priced` (the reservoir's population)."""

    def add_priced(self, prompt_est: float, usd: float) -> None:
        """An answer's estimated prompt and what it cost, for the dollars per item to come."""
        self.priced_n += 1
        keep(self.priced, self.priced_n, (prompt_est, usd), self.rng)

    def usd_per_item(self) -> float | None:
        """What an item still to send is expected to cost: its answers' dollars adjusted to
        the prompts to come (`Stat.regressed`: a prompt is most of an agent turn's bill, and a
        pilot that drew longer prompts than the rest have would put every one of them too
        dear). None: no answer priced yet."""
        if not self.priced:
            return None
        to = self.prompt_to_come
        last = self._usd_per_item
        # Worked out again once the answers or the prompts to come moved by a percent or two
        # (a few milliseconds over a full reservoir, for every flow at every progress line).
        if (
            last is None
            or self.priced_n > last[0] * 1.02 + 1
            or (to is None) != (last[1] is None)
            or (to is not None and last[1] is not None and abs(to - last[1]) > 0.01 * last[1])
        ):
            xs = [x for x, _ in self.priced]
            ys = [y for _, y in self.priced]
            last = self._usd_per_item = (self.priced_n, to, Stat.regressed(ys, xs, to).mean)
        return last[2]

    _usd_per_item: tuple[int, float | None, float] | None = None
    """The last `usd_per_item`: the answers and the prompts to come it was for, and it."""


@dataclass(frozen=True)
class LatencyModel:
    """A time-on-the-wire distribution (Kaplan-Meier): its mean, the sd of one draw, how many
    answers it rests on, and its survival curve (times, S(t) just after each)."""

    mean: float
    sd: float
    n: int
    times: tuple[float, ...]
    survival: tuple[float, ...]
    extrapolated: float = 0.0
    """The share of the distribution beyond the longest time seen, which the log-normal tail
    stands in for: the larger, the less the mean and especially the drain are known."""

    def drain(self, k: int) -> tuple[float, float]:
        """Mean and sd of the time until the last of `k` requests caught in flight ends: the
        maximum of k residual lifetimes, whose survival is the area under S beyond t over
        the mean. This is the tail of a lane, where its slowest answers decide the end."""
        if k <= 0 or self.mean <= 0:
            return 0.0, 0.0
        # Area under S from each grid time to the end (S is a step function).
        tail = [0.0] * (len(self.times) + 1)
        for i in range(len(self.times) - 1, 0, -1):
            tail[i] = tail[i + 1] + self.survival[i - 1] * (self.times[i] - self.times[i - 1])
        tail[0] = tail[1] + self.times[0]  # S = 1 before the first time
        grid = (0.0, *self.times)
        first = second = 0.0
        prev_t, prev_g = 0.0, 1.0 - (1.0 - min(1.0, tail[0] / self.mean)) ** k
        for t, area in zip(grid[1:], tail[1:], strict=True):
            g = 1.0 - (1.0 - min(1.0, area / self.mean)) ** k  # P(max > t)
            first += (prev_g + g) / 2 * (t - prev_t)
            second += (prev_g * prev_t + g * t) * (t - prev_t)  # E[M^2] = int 2t P(M>t)
            prev_t, prev_g = t, g
        sd = math.sqrt(max(0.0, second - first * first))
        # The slowest of k rests on the few longest answers: its spread is large whatever
        # the sample (a third of it, measured on mixtures of log-normal lengths), and larger
        # where the tail is extrapolated.
        sd = max(sd, DRAIN_RSD * first)
        return first, math.hypot(sd, first * min(1.0, 3.0 * self.extrapolated))


def _lognormal_tail(times: list[float], curve: list[float]) -> tuple[float, float] | None:
    """(mu, sigma) of a log-normal fitted to the upper half of a survival curve, by regressing
    log t on the normal quantile of 1 - S(t) (a probability plot)."""
    pts = [
        (math.log(t), NORMAL.inv_cdf(1.0 - s))
        for t, s in zip(times, curve, strict=True)
        if t > 0 and 0.0 < s <= 0.5
    ]
    if len(pts) < 3:
        pts = [
            (math.log(t), NORMAL.inv_cdf(1.0 - s))
            for t, s in zip(times, curve, strict=True)
            if t > 0 and 0.0 < s < 1.0
        ]
    if len(pts) < 3:
        return None
    mx = sum(z for _, z in pts) / len(pts)
    my = sum(y for y, _ in pts) / len(pts)
    sxx = sum((z - mx) ** 2 for _, z in pts)
    if sxx <= 0:
        return None
    sigma = sum((z - mx) * (y - my) for y, z in pts) / sxx
    if sigma <= 0:
        return None
    return my - sigma * mx, sigma


def kaplan_meier(
    done: Sequence[float], censored: Iterable[float], censored_weight: float = 1.0
) -> LatencyModel | None:
    """The distribution of times from finished answers and requests still running (censored
    at their age). Where the requests still running leave the tail unknown (early in a run, the
    long answers have not ended yet), the curve is extended by a constant-hazard tail measured
    on the slowest answers, rather than cut at the longest time seen (which would make every
    early ETA short). When `done` is a sample of the answers, `censored_weight` is its rate,
    so that the requests in flight (all of them) keep their true share."""
    if not done:
        return None
    events = sorted([(t, 1.0) for t in done] + [(t, 0.0) for t in censored])
    at_risk = float(len(done)) + censored_weight * (len(events) - len(done))
    survival, times, curve = _product_limit(events, at_risk, censored_weight)
    # What was seen says nothing below a resolution of one answer in n: never claim less
    # mass than that beyond the longest time seen (the slowest of many in flight lives there).
    survival = max(survival, 1.0 / len(done))
    curve[-1] = survival
    extrapolated = survival
    t_end = max(times[-1], events[-1][0])
    if t_end > times[-1]:
        # Requests still running are known to last at least as long as they have so far.
        times.append(t_end)
        curve.append(survival)
    rate = _tail_hazard(events, times, curve, censored_weight, done)
    _extend_tail(times, curve, survival, t_end, rate)
    mean, var = _moments(times, curve)
    return LatencyModel(mean, math.sqrt(var), len(done), tuple(times), tuple(curve), extrapolated)


def _product_limit(
    events: list[tuple[float, float]], at_risk: float, censored_weight: float
) -> tuple[float, list[float], list[float]]:
    """The Kaplan-Meier curve over the sorted events (time, 1.0 for an answer, 0.0 for a
    request still running): the survival at the end, and S(t) just after each answer."""
    survival = 1.0
    times: list[float] = []
    curve: list[float] = []
    for t, died in events:
        if died:
            survival *= 1.0 - 1.0 / at_risk
            times.append(t)
            curve.append(survival)
            at_risk -= 1.0
        else:
            at_risk -= censored_weight
    return survival, times, curve


def _tail_hazard(
    events: list[tuple[float, float]],
    times: list[float],
    curve: list[float],
    censored_weight: float,
    done: Sequence[float],
) -> float:
    """The constant hazard that completes the tail, measured on the highest part of the curve
    that has enough answers (on a mixture, its long component decides how the tail goes on;
    a log-normal fitted to the whole overshoots there); with none, one over the mean answer."""
    deaths, exposure = 0, 0.0
    for level in (0.05, 0.1, 0.25, 0.5, 1.0):
        t_h = next((t for t, s_after in zip(times, curve, strict=True) if s_after <= level), None)
        if t_h is None:
            continue
        deaths = sum(1 for t, died in events if died and t > t_h)
        exposure = sum(
            (t - t_h) * (1.0 if died else censored_weight) for t, died in events if t > t_h
        )
        if deaths >= 20:
            break
    return deaths / exposure if deaths and exposure > 0 else 1.0 / max(1e-9, sum(done) / len(done))


def _extend_tail(
    times: list[float], curve: list[float], survival: float, t_end: float, rate: float
) -> None:
    """The curve carried on past `t_end` at hazard `rate` until it is all but gone, then 0."""
    t, step = t_end, max(0.05 * t_end, 0.1 / rate, 1e-6)
    for _ in range(400):  # bounded whatever the floats do; the tail is gone well before
        t += step
        times.append(t)
        curve.append(survival * math.exp(-rate * (t - t_end)))
        if curve[-1] <= 1e-4:
            break
    curve[-1] = 0.0


def _moments(times: list[float], curve: list[float]) -> tuple[float, float]:
    """The mean and variance of the time, from the areas under the step curve S."""
    mean = second = 0.0
    prev_t, prev_s = 0.0, 1.0
    for t, s_after in zip(times, curve, strict=True):
        # S is prev_s on [prev_t, t): its area gives E[L], and 2t S(t) gives E[L^2].
        mean += prev_s * (t - prev_t)
        second += prev_s * (t * t - prev_t * prev_t)
        prev_t, prev_s = t, s_after
    return mean, max(0.0, second - mean * mean)


@dataclass(frozen=True)
class Eta:
    """Seconds left: the estimate and its p10-p90 interval; `bound` says what ends the work
    (`count`: the items run out; `budget`: a token budget or dollar cap stops it first)."""

    seconds: float
    p10: float
    p90: float
    bound: str = "count"
    drain: float = 0.0
    """Of `seconds`, the time the last requests on the wire take to end once nothing more is
    sent: what a stop (the job's dollar cap) still leaves to wait for."""
    prior: bool = False
    """This run has not measured its own pace yet (too few of its answers, or a lane not yet
    full for long): the figures rest on earlier answers (a pilot's) and a guess at the
    concurrency, so they are a range to show as such, not a point."""


@dataclass
class Concurrency:
    """Requests on the wire, integrated over time: the mean over a recent window."""

    busy_s: float = 0.0
    last: float = 0.0
    in_flight: int = 0
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))
    full_since: float | None = None
    """When the lane first had as many on the wire as its limit allowed: the seconds before,
    while it filled up (a lane fed by escalations fills slowly), say nothing of its pace."""
    peak: int = 0
    """The most requests on the wire at once so far: until its pace is measured, what a lane
    will keep on the wire is taken as that, never the few it had out in its first second."""
    began: float | None = None
    """When the lane first sent (its first change)."""
    earlier: float | None = None
    """The mean requests on the wire of the latest earlier run (a killed one's too): until
    this run measures its own, the lane's pace, known to EARLIER_RSD (not a guess)."""
    ceiling: float | None = None
    """What the lane's provider is expected to let it keep on the wire, where it refused
    requests for capacity before (state.runs.LaneCapacity.on_wire, the plan's figure): until
    this run measures its own pace, a lane that fills to its limit at once (its requests are
    refused as fast as they go out) is not taken to keep that limit on the wire."""
    ceiling_rsd: float = UNMEASURED_RSD
    """How well `ceiling` is known: EARLIER_RSD where an earlier run kept it on the wire; a
    share of the most a pilot had answered at once is a guess (its ETA is then `prior`)."""

    def full(self, now: float) -> None:
        if self.full_since is None:
            self.full_since = now

    def change(self, now: float, delta: int) -> None:
        if self.began is None:
            self.began = now
        if self.samples:
            self.busy_s += self.in_flight * (now - self.last)
        else:
            self.samples.append((now, 0.0))  # the timeline starts with its first change
        self.last = now
        self.in_flight += delta
        self.peak = max(self.peak, self.in_flight)

    def mean(self, now: float, window_s: float = 30.0, *, limit: int = 0) -> tuple[float, float]:
        """Mean requests on the wire over about the last `window_s`, and the relative
        standard error of that mean from its one-second steps (how steady the rate was).
        Until the lane has been full for a few seconds (or, never full, has run for
        FILL_S) its pace is not measured: then, once full past its first second, the most it
        has had on the wire (or its `limit`, if more) with EARLIER_RSD; else the pace of the
        latest earlier run with EARLIER_RSD; else that most with UNMEASURED_RSD. That most is
        never more than the `ceiling` earlier refusals set, known to its `ceiling_rsd`."""
        self.change(now, 0)
        if now - self.samples[-1][0] >= 1.0:
            self.samples.append((now, self.busy_s))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window_s:
            self.samples.popleft()
        while (
            len(self.samples) > 2
            and self.full_since is not None
            and self.samples[0][0] < self.full_since
        ):
            self.samples.popleft()
        t0, b0 = self.samples[0]
        points = list(self.samples)
        steps = [
            (bb - ba) / (tb - ta) for (ta, ba), (tb, bb) in itertools.pairwise(points) if tb > ta
        ]
        filled = self.full_since is not None
        if now - t0 < 1.0 or (len(steps) < 2 if filled else now - t0 < FILL_S):
            most = float(max(self.peak, self.in_flight, limit))
            full_rsd, unfilled_rsd = EARLIER_RSD, UNMEASURED_RSD
            if self.ceiling is not None and self.ceiling < most:
                most = self.ceiling
                full_rsd = unfilled_rsd = self.ceiling_rsd
            if filled and self.began is not None and now - self.began >= 1.0:
                # Full past its first second: it keeps its limit while fed; how long it is
                # fed (escalations) is what may move, as an earlier run's pace may.
                return most, full_rsd
            if self.earlier:
                return self.earlier, EARLIER_RSD
            return most, unfilled_rsd
        level = (self.busy_s - b0) / (now - t0)
        if level <= 0 or len(steps) < 2:
            return level, 0.5
        mean_step = sum(steps) / len(steps)
        spread = math.sqrt(sum((x - mean_step) ** 2 for x in steps) / (len(steps) - 1))
        return level, spread / level / math.sqrt(len(steps))


def escalation_order(escalate_to: Mapping[str, str | None]) -> list[str]:
    """Lane names (from each lane's `escalate_to`), each after the lanes that escalate to it:
    what a lane sends on is work for the lane it sends to, which cannot end before it does."""
    out: list[str] = []

    def visit(name: str, seen: frozenset[str]) -> None:
        if name in out or name in seen:
            return
        for src, to in escalate_to.items():
            if to == name:
                visit(src, seen | {name})
        out.append(name)

    for name in escalate_to:
        visit(name, frozenset())
    return out


def escalations_var(flow: Flow, items: float, items_var: float = 0.0) -> float:
    """The variance of how many of `items` (itself unsure by `items_var`) the flow sends on:
    its escalation share is measured on its answers so far, a pilot's few at the start, and
    each item escalates or not on its own."""
    p = flow.escalation_share
    share_var = p * (1.0 - p) / max(1, flow.answered)
    return items * items * share_var + items * p * (1.0 - p) + items_var * (p * p + share_var)


def items_left(
    flow: Flow, tokens_left: float | None, usd_left: float | None, coming: float = 0.0
) -> tuple[int, str]:
    """Items this run will still finish: pending ones and the escalations still to come into
    it (`coming`), or fewer when a budget stops first. A budget already met (earlier runs'
    spend counts) leaves none, answers of this run or not: a rerun must not count a met
    dataset's pending items as work to come."""
    n = flow.remaining + round(coming)
    bound = "count"
    if n and any(left is not None and left <= 0 for left in (tokens_left, usd_left)):
        return 0, "budget"
    for left, each in ((tokens_left, flow.tokens_per_item()), (usd_left, flow.usd_per_answer())):
        if left is None or not each or each <= 0:
            continue
        allowed = max(0, math.ceil(left / each))
        if allowed < n:
            n, bound = allowed, "budget"
    return n, bound


def _pooled_model(flows: Sequence[tuple[Flow, int, str]], now: float) -> LatencyModel | None:
    """The lane's latencies, all its datasets together: the model of a dataset too new for
    its own."""
    pooled_done: list[float] = []
    pooled_censored: list[float] = []
    answers = 0
    for flow, _, _ in flows:
        pooled_done.extend(flow.latencies)
        pooled_censored.extend(flow.censored(now))
        answers += flow.answers
    return kaplan_meier(pooled_done, pooled_censored, len(pooled_done) / max(1, answers))


def _flow_model(flow: Flow, now: float, pooled: LatencyModel | None) -> LatencyModel | None:
    """A dataset's own latency model once it has MIN_SAMPLE answers, else the lane's."""
    model = None
    if len(flow.latencies) >= MIN_SAMPLE:
        model = kaplan_meier(
            flow.latencies,
            flow.censored(now),
            len(flow.latencies) / max(1, flow.answers),
        )
    return model or pooled


@dataclass
class _LaneWork:
    """The lane's work summed over its datasets so far, in seconds of one slot."""

    work: float = 0.0
    var: float = 0.0
    earlier_work: float = 0.0
    """Resting on earlier runs' answers alone (datasets not reached yet)."""
    drift_var: float = 0.0
    """The variance of that work from each dataset's own drift (EARLIER_DRIFT), summed."""
    earlier_var: float = 0.0
    """The part of the work's variance that measured means and shares bring as they are (the
    earlier answers' means, the escalations still to come): kept out of SD_SCALE."""

    def add(self, flow: Flow, n: int, model: LatencyModel, own: bool) -> None:
        """A dataset's items not on the wire yet, each its mean time (and a share of failed
        attempts' time), with the variance of that sum; `own`: the model is the flow's own
        (not its lane's pool)."""
        # Failed attempts' time on the wire is overhead on every answer.
        overhead = flow.failed_wire_s / max(1, flow.answers)
        unstarted = max(0, n - len(flow.on_wire))
        each = model.mean * (flow.prompt_factor() if own else 1.0)
        self.work += unstarted * (each + overhead)
        if flow.finished < RUN_ANSWERS:
            self.earlier_work += unstarted * (each + overhead)
            self.drift_var += (unstarted * (each + overhead) * EARLIER_DRIFT) ** 2
        # The mean's standard error, scaled to the items left, their own spread, and how much
        # of the mean rests on the extrapolated tail. The earlier answers' part of the error
        # is measured as it is (Stat.regressed holds the true mean ~4 times in 5), so it
        # stays out of the modelled run's SD_SCALE.
        earlier_se, se = flow.mean_errors(model) if own else (0.0, model.sd / math.sqrt(model.n))
        self.earlier_var += (unstarted * earlier_se) ** 2 + flow.coming_var * model.mean**2
        # Each item's own time varies about its mean at its prompt by what the prompt leaves.
        spread = model.sd * (flow.prompt_spread() if own else 1.0)
        self.var += (
            (unstarted * se) ** 2
            + unstarted * spread**2
            + (unstarted * model.mean * model.extrapolated) ** 2
        )

    def sd(self, c: float, drain_sd: float, concurrency_rsd: float) -> float:
        """The sd of the time to finish: the work's spread, the drain's, and the pace's."""
        run = self.var / (c * c) + drain_sd**2 + (self.work / c * concurrency_rsd) ** 2
        # Each dataset's drift on its own, and a shift common to all the lane's.
        drift = self.drift_var / (c * c) + (self.earlier_work / c * EARLIER_SHIFT) ** 2
        earlier = self.earlier_var / (c * c) + drift
        return math.sqrt(SD_SCALE**2 * run + earlier)


def _eta(seconds: float, sd: float, bound: str, drain: float, prior: bool) -> Eta:
    """The ETA with its p10-p90 interval: symmetric when measured, log-normal when `prior`."""
    if prior and seconds > 0:
        # Not a point: a range, skewed as a guess at a pace is (never down to zero).
        s = math.sqrt(math.log1p((sd / seconds) ** 2))
        low, high = seconds * math.exp(-Z90 * s), seconds * math.exp(Z90 * s)
        return Eta(seconds, low, high, bound, drain, prior=True)
    return Eta(seconds, max(0.0, seconds - Z90 * sd), seconds + Z90 * sd, bound, drain)


def lane_eta(
    flows: Sequence[tuple[Flow, int, str]],
    now: float,
    concurrency: float,
    concurrency_rsd: float,
) -> list[Eta | None]:
    """For a lane's datasets in order, given (flow, items left, bound): when each will be
    finished in this lane (cumulative). None where nothing can be said yet (no answers).

    Items not yet on the wire take `mean` each of the lane's `concurrency`; then the last
    requests of the dataset drain (the slowest residual among those in flight). Requests on the
    wire now are half done on average, which the drain of the last ones stands in for.

    Until the lane has RUN_ANSWERS answers (this run's or earlier runs') and a measured pace
    (`concurrency_rsd` below UNMEASURED_RSD: this run's, or an earlier run's), each ETA is
    `prior`: its interval, log-normal, is what to show.
    """
    pooled = _pooled_model(flows, now)
    out: list[Eta | None] = []
    lane = _LaneWork()
    known = True
    # Nothing on the wire yet and no pace known: no figure can be backed (not even a range).
    started = concurrency >= 1.0 or concurrency_rsd < UNMEASURED_RSD
    c = max(concurrency, 1.0)
    # Earlier runs' answers and pace are measurements too: only a lane with neither is a guess.
    prior = concurrency_rsd >= UNMEASURED_RSD or sum(f.answers for f, _, _ in flows) < RUN_ANSWERS
    for flow, n, bound in flows:
        model = _flow_model(flow, now, pooled)
        if model is None or not known or (n and not started):
            known = known and n == 0
            out.append(Eta(0.0, 0.0, 0.0, bound) if known else None)
            continue
        lane.add(flow, n, model, model is not pooled)
        drain, drain_sd = model.drain(min(n, round(c))) if n else (0.0, 0.0)
        seconds = lane.work / c + drain
        out.append(_eta(seconds, lane.sd(c, drain_sd, concurrency_rsd), bound, drain, prior))
    return out


def combine(etas: Iterable[Eta | None]) -> Eta | None:
    """The later of several ETAs (lanes run side by side; the work ends with the last)."""
    found = list(etas)
    if not found or any(e is None for e in found):
        return None
    last = [e for e in found if e is not None]
    seconds = max(e.seconds for e in last)
    return Eta(
        seconds,
        max(e.p10 for e in last),
        max(e.p90 for e in last),
        "budget" if any(e.bound == "budget" for e in last) else "count",
        # A guess that even at its p90 ends before the measured end decides nothing: a lane
        # fed by few escalations must not make the job's figure `prior` for the whole run.
        prior=any(e.prior and e.p90 >= seconds for e in last),
    )


def spend_reaches(pieces: Sequence[tuple[float, float, float]], room: float) -> float | None:
    """When spending reaches `room`: each piece (start, end, dollars) spends at an even rate
    from its start to its end (seconds from now). None when all of it fits."""
    if sum(usd for _, _, usd in pieces) <= room:
        return None

    def spent(t: float) -> float:
        return sum(
            usd * (1.0 if t >= end else 0.0 if t <= start else (t - start) / (end - start))
            for start, end, usd in pieces
        )

    lo, hi = 0.0, max(end for _, end, _ in pieces)
    for _ in range(60):  # bisection: spent() is continuous and rises with t
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spent(mid) < room else (lo, mid)
    return hi


FED_STEPS = 200
"""Steps over a fed lane's time when its spending is played out (`fed_spending`)."""


@dataclass(frozen=True)
class FedFlow:
    """One dataset of a lane fed by escalations, for `fed_spending`."""

    items: float
    """Items left, those still to be escalated into it included."""
    coming: float
    """Of them, those still to be escalated."""
    seconds: float
    """Lane-seconds an item takes: its time on the wire over the lane's limit."""
    usd: float
    """Dollars an item costs."""
    sent: tuple[float, float] | None
    """When its sending lane sends them on (seconds from now: start, end); None: not known,
    they count as waiting now."""


def fed_spending(flows: Sequence[FedFlow], end: float) -> list[tuple[float, float, float]]:
    """How a lane fed by escalations spends until `end` (its ETA), as pieces (start, end,
    dollars) for `spend_reaches`, played out step by step as the feeder hands out: first
    escalated, first out (`Feeder._feed_escalated`). What waits now goes first, in the job's
    order (the lane that sends it on reached its datasets in that order), then what comes, as
    it is sent. So a dataset its sending lane reaches last (agent turns after code) goes out
    last, and the lane's pace is set so that its work ends at `end`. Spread over the lane's
    whole time, the dear items last had the cap's room run out too soon (bench/realistic.py:
    every miss short, -16 to -28%)."""
    work = sum(f.items * f.seconds for f in flows)
    total = sum(f.items * f.usd for f in flows)
    if end <= 0 or work <= 0:
        return [(0.0, max(0.0, end), total)] if total > 0 else []
    dt = end / FED_STEPS
    queue: deque[list[float]] = deque([i, f.items - _coming(f)] for i, f in enumerate(flows))
    left = sum(f.items for f in flows)
    pieces: list[tuple[float, float, float]] = []
    for step in range(5 * FED_STEPS):
        t = step * dt
        for i, f in enumerate(flows):
            n = _coming(f) * _sent_share(f.sent, t, dt, step == 0)
            if n > 0:
                queue.append([i, n])
        # The lane's pace is set so that its work ends at `end`.
        spent, taken = _hand_out(queue, flows, dt * work / end)
        pieces.append((t, t + dt, spent))
        left -= taken
        if left <= 1e-6:
            break
    return pieces


def _hand_out(
    queue: deque[list[float]], flows: Sequence[FedFlow], work: float
) -> tuple[float, float]:
    """`work` lane-seconds of a fed lane's queue ((dataset index, items) in the order they
    came), from its head: the dollars spent and the items taken."""
    spent = taken = 0.0
    while queue and work > 1e-12:
        i, n = int(queue[0][0]), queue[0][1]
        f = flows[i]
        k = min(n, work / f.seconds) if f.seconds > 0 else n
        spent += k * f.usd
        taken += k
        work -= k * f.seconds
        queue[0][1] = n - k
        if queue[0][1] <= 1e-9:
            queue.popleft()
    return spent, taken


def _coming(f: FedFlow) -> float:
    """A fed dataset's items still to be escalated, where when they come is known."""
    return 0.0 if f.sent is None else min(f.items, max(0.0, f.coming))


def _sent_share(sent: tuple[float, float] | None, t: float, dt: float, first: bool) -> float:
    """The share of a dataset's escalations to come that are sent from `t` to `t + dt`:
    evenly over its sending lane's time for it (all at once where that has no length; the
    first step takes what is already due)."""
    if sent is None:
        return 0.0
    start, end = sent
    if end > start:
        return max(0.0, min(end, t + dt) - max(start, t)) / (end - start)
    return 1.0 if start < t + dt and (start >= t or first) else 0.0


def cut_at(eta: Eta, stop: float, stop_sd: float = 0.0, drained: bool = False) -> Eta:
    """An ETA that a stop at `stop` seconds cuts short: then the requests on the wire end (its
    drain; `drained`: the stop's time has them ended already), its interval scaled with it
    and widened by how unsure the stop is (`stop_sd`: the dollars per item it rests on),
    never past the uncut one's. What ends before is left."""
    seconds = min(eta.seconds, stop if drained else stop + eta.drain)
    if eta.seconds <= stop or seconds >= eta.seconds:
        return eta
    k = seconds / eta.seconds
    low = math.hypot((eta.seconds - eta.p10) * k, Z90 * stop_sd)
    high = math.hypot((eta.p90 - eta.seconds) * k, Z90 * stop_sd)
    return Eta(
        seconds,
        max(0.0, seconds - low),
        min(max(eta.p90, seconds), seconds + high),
        "budget",
        eta.drain,
        eta.prior,
    )


def spend_rse(flow: Flow) -> float:
    """How unsure a flow's dollars per item are, relative: as unsure as its time on the wire
    (both follow its answers' tokens), from earlier runs' answers while this run has few."""
    if flow.finished < RUN_ANSWERS and flow.earlier_rse is not None:
        return flow.earlier_rse
    n = len(flow.latencies)
    if n < 2:
        return PRIOR_REL_SD
    mean = sum(flow.latencies) / n
    var = sum((x - mean) ** 2 for x in flow.latencies) / (n - 1)
    return math.sqrt(var / n) / mean if mean > 0 else 0.0


def eta_text(eta: Eta | None) -> str:
    """`12m (10m-15m)`; before the run has measured its pace, only the range and what it
    rests on: `~2m-9m (prior)`."""
    if eta is None:
        return "-"
    if eta.seconds <= 0:
        return "0s"
    if eta.prior:
        text = f"~{format_duration(eta.p10)}-{format_duration(eta.p90)} (prior)"
    else:
        text = (
            f"{format_duration(eta.seconds)} "
            f"({format_duration(eta.p10)}-{format_duration(eta.p90)})"
        )
    return text + (" budget" if eta.bound == "budget" else "")


PRIOR_REL_SD = 0.8
"""How unsure a prior Stat's mean is (the sd of its logarithm) where it is summed as if
measured; the plan's own intervals for a prior are bands (forecast.PriorBand)."""
ESCALATED_MIN = 10
"""Escalations of this run before their prompts stand for those still to come."""
REGRESS_MIN = 20
"""Passages needed before their prompt sizes adjust a mean (Stat.regressed)."""
REGRESS_CLAMP = 3.0
"""A prompt-size adjustment beyond this factor is not trusted: the plain mean stands."""


@dataclass(frozen=True, slots=True)
class Stat:
    """A per-passage quantity: its mean, the sd of one draw, and how many it rests on (0: a
    prior, whose mean is unsure by PRIOR_REL_SD)."""

    mean: float
    sd: float
    n: int
    error: float | None = None
    """The standard error of the mean, when not sd / sqrt(n) (a regression's)."""

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stat:
        """The sample's mean and sd. Times and dollars are skewed (a few long answers hold
        much of the total): from a small sample, sd / sqrt(n) understates how far the mean may
        be off, and the sample's own sd runs short. Their error is at least Cox's for the mean
        of a log-normal, from the spread of the logarithms."""
        n = len(xs)
        mean = sum(xs) / n
        var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else mean**2
        error = None
        if n >= 3 and min(xs) > 0:
            logs = [math.log(x) for x in xs]
            m = sum(logs) / n
            s2 = sum((y - m) ** 2 for y in logs) / (n - 1)
            cox = mean * math.sqrt(s2 / n + s2 * s2 / (2 * (n - 1)))
            if cox > math.sqrt(var / n):
                error = cox
        return cls(mean, math.sqrt(var), n, error)

    @classmethod
    def regressed(cls, ys: Sequence[float], xs: Sequence[float], x_to: float | None) -> Stat:
        """The mean of `ys` for passages whose `xs` average `x_to` (the regression estimator
        of survey sampling): a sample of 30 that happened to draw few long prompts says so in
        its prompts, and the answers' lengths follow them. Falls back to the plain mean with
        fewer than REGRESS_MIN, no spread in `xs`, or a correction beyond REGRESS_CLAMP."""
        plain = cls.of(ys)
        n = len(ys)
        if x_to is None or n < REGRESS_MIN:
            return plain
        mx = sum(xs) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx <= 0:
            return plain
        slope = sum((x - mx) * (y - plain.mean) for x, y in zip(xs, ys, strict=True)) / sxx
        mean = plain.mean + slope * (x_to - mx)
        if not plain.mean / REGRESS_CLAMP <= mean <= plain.mean * REGRESS_CLAMP:
            return plain
        # The error of the prediction at x_to, robust to a spread that grows with x (long
        # prompts' answers vary most): the sandwich (HC1) form, each residual by its weight.
        var = sum(
            ((1 / n + (x_to - mx) * (x - mx) / sxx) * (y - plain.mean - slope * (x - mx))) ** 2
            for x, y in zip(xs, ys, strict=True)
        )
        error = math.sqrt(var * n / (n - 2))
        # As skewed as the plain mean is (Stat.of), relative to sd / sqrt(n).
        error *= plain.se / (plain.sd / math.sqrt(n)) if plain.sd > 0 else 1.0
        return cls(mean, plain.sd, n, error)

    @property
    def se(self) -> float:
        """The standard error of the mean."""
        if self.error is not None:
            return self.error
        return self.sd / math.sqrt(self.n) if self.n else PRIOR_REL_SD * self.mean

    def total_sd(self, count: float) -> float:
        """The sd of the sum over `count` more passages: the mean's error counts `count`
        times over, each passage's own spread once."""
        return math.sqrt((count * self.se) ** 2 + count * self.sd**2)
