"""What the rest of a job will take: items, attempts, tokens, dollars and time, per dataset and
lane, with p10-p90 intervals, and which budget or cap stops it first.

The unit is a *passage*: one item going through one lane, from its first attempt there to its
answer, its failure, or the truncated answer that sends it on to a longer lane (`escalate_to`;
both answers are paid). Each lane is measured on its own finished passages (state.db's attempts
and ledger name the lane), per dataset where a dataset has at least MIN_PASSAGES of them (or
fewer that show it differs from the lane's pool), else over the lane: per passage, the
attempts, the share escalated and failed, the dollars and tokens charged (failed attempts a
provider billed included), the time on the wire and the time it held a worker (back-offs and
waits for a slot between attempts included).

A lane with no finished passage rests on a stated prior (PRIOR_*): completions of max_tokens/4
on average, answered at PRIOR_TOKENS_PER_S after PRIOR_TTFT_S, priced at the endpoint's prices,
its mean known only to within a factor of about 2.8 either way (p10-p90).

Passages expected per lane: its pending items, plus what lanes escalating to it are expected to
send on. A dataset's token budget or dollar cap cuts its passages where it will stop them.

Time, per lane: its datasets go in order through `concurrency` workers, and at most `on_wire`
requests are on the wire: the lane's concurrency, unless its provider refused requests for
capacity (429s). Then it is what the latest finished run kept on the wire, or, with only a
pilot, ADAPTIVE_SHARE of the most requests the provider answered at once (on_wire_for).
Passages leave at the slower of the two rates (workers over time held, on_wire over time on
the wire); the last requests then drain (the slowest
of those left in flight, from the lane's latency distribution, as the ETA does). Lanes run side
by side; a lane fed by escalations ends after the lane feeding it. Where the dollars expected
pass the job's cap or the account's credit, the run's own order says when and what stays
pending (regen.run.ending): each lane's escalated backlog first, then its datasets in order,
every lane at once.

The interval of a sum combines each mean's standard error (shrinking as answers come) with the
spread of the remaining passages' own values; bench/plan.py checks both against real runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from regen.config import Job, LaneConfig
from regen.engine.budget import Prices
from regen.engine.eta import (
    Z90,
    LatencyModel,
    Stat,
    escalation_order,
    format_duration,
    kaplan_meier,
)
from regen.run.caching import FlowCache, per_passage
from regen.run.ending import Budget, Ending, Flow, Lane, play
from regen.state.runs import ADAPTIVE_SHARE, LaneCapacity
from regen.state.spend import FlowEntry
from regen.state.work import DatasetProgress

FEW_PASSAGES = 30
"""Fewer finished passages than this behind an estimate: the plan says so."""
MIN_PASSAGES = 10
"""Fewer finished passages than this of a dataset in a lane: use the lane's, pooled, unless
the dataset's own (MIN_OWN at least) show that it differs from the pool."""
MIN_OWN = 3
"""The fewest passages of a dataset that can show it differs from its lane's pool."""
DIFFERS_SE = 2.0
"""A dataset differs from its lane's pool when its own mean dollars or time on the wire are
this many of its own standard errors away from the pool's: a long lane fed by datasets of
very different prompts (agent trajectories beside chat) pools to a mean none of them has
(bench/realistic.py: 5x a chat dataset's own long-lane dollars)."""
DIFFERS_FACTOR = 2.0
"""...and at least this many times above or below it: a few answers' own spread says little,
and datasets alike differ from their pool by sampling alone (bench/plan.py's `lanes`: a chat
dataset's 3 long-lane answers at half the pool's dollars, the run's at 0.8 of it)."""
PRIOR_LENGTH_SHARE = 0.25
"""Before any answer, a completion is taken as this share of the lane's max_tokens."""
PRIOR_TTFT_S = 1.0
PRIOR_TOKENS_PER_S = 50.0
"""Before any answer, an answer takes PRIOR_TTFT_S plus its tokens at this rate: a hosted
model under load, slower than its quoted peak."""
PRIOR_LENGTH_CV = 1.0
"""The spread of one prior completion (its sd over its mean)."""
PRIOR_LENGTH_BAND = 4.0
"""How far the prior's mean completion may be off, as its p10-p90: from a sixteenth of
max_tokens (a chat model answering in a few hundred tokens under a generous max_tokens) to all
of it (a reasoning model that fills it). On bench/plan.py's workloads the no-pilot plan then
held 90% of the actuals (a band of 6: 100%, too wide to say anything; 3: 79%)."""
PRIOR_SPEED_BAND = 2.0
"""How far the prior's tokens/s and time to the first token may be off (p10-p90)."""
LIMIT_RSD = 0.1
"""How far the requests a provider lets a lane keep on the wire may move in the next run."""
PACE_RSD = 0.08
"""How far a whole lane's pace may move from what its answers so far measured, whatever their
number: a pilot's requests find the provider and the machine otherwise than the run's will
(cold connections, other load, the provider's speed over the day). On bench/plan.py's
workloads a dataset's mean time in the run was 0.74 to 1.27 times its pilot's, the pilot's
sampling included; where a pilot sends a dataset first, into its cold start, about 0.86 times
(0.75-0.84 with a CPU load beside both)."""
BOUND_PER_EST = 4
"""A prompt's tokenizer-free bound (its UTF-8 bytes, the gate's) is about this many times its
estimate (characters / 4)."""
BOUND_OVERHEAD = 256
"""What the bound adds per request for the chat template's markers."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean and its p10-p90 interval."""

    mean: float
    p10: float
    p90: float
    prior: bool = False
    """It rests (in part) on the prior of a lane without answers: a guess whose error every
    flow it touches shares, so its sums add p10s and p90s rather than spreads."""

    @classmethod
    def of(cls, mean: float, sd: float) -> Interval:
        """From a mean and an sd, as a log-normal (never below zero, skewed as sums of
        lengths are)."""
        if mean <= 0:
            return cls(0.0, 0.0, 0.0)
        s = math.sqrt(math.log1p((sd / mean) ** 2))
        return cls(mean, mean * math.exp(-Z90 * s), mean * math.exp(Z90 * s))

    def __str__(self) -> str:
        return f"{self.mean:.4g} ({self.p10:.4g}-{self.p90:.4g})"


@dataclass(frozen=True, slots=True)
class Profile:
    """What one passage through a lane takes, measured or assumed."""

    basis: str
    passages: int
    cost_usd: Stat | None
    completion_tokens: Stat
    prompt_tokens: Stat
    held_s: Stat
    """Time a worker holds the passage (attempts, back-offs, waits for a slot)."""
    wire_s: Stat
    """Time on the wire, over its attempts."""
    attempts: float
    escalated: float
    failed: float
    latency: LatencyModel | None
    escalated_prompt: float | None = None
    """Mean estimated prompt tokens of the passages it is expected to escalate."""
    escalated_sd: float = 0.0
    """How unsure the share escalated is (its sd): a share of a few passages is a wide one."""
    band: PriorBand | None = None
    """A prior's p10 and p90 per passage (None: measured, its spread is in its stats)."""
    uncached_usd: float | None = None
    """Its dollars per passage without a prompt cache, where `cost_usd` prices one in."""

    @classmethod
    def measured(
        cls,
        basis: str,
        entries: Sequence[FlowEntry],
        latencies: Sequence[float],
        prompt_est: float | None,
        censored: Sequence[float] = (),
    ) -> Profile:
        """From finished passages; `prompt_est`: the mean estimated prompt tokens of the
        passages to come (None: unknown), which adjusts each mean for prompt size;
        `censored`: the lane's times known only as lower bounds (answers still running when
        their attempt was cut short), which lengthen its times (`censored_stat`)."""
        n = len(entries)
        xs = [float(e.prompt_tokens_est) for e in entries]

        def stat(ys: list[float]) -> Stat:
            return Stat.regressed(ys, xs, prompt_est)

        # Which passages get truncated depends on their prompts: the share escalated, and the
        # prompt size of those escalated, adjusted to the prompts to come as the means are.
        escalated = [1.0 if e.outcome == "escalated" else 0.0 for e in entries]
        share_stat = stat(escalated)
        escalated_prompt = None
        if any(escalated):
            share = share_stat.mean
            weighted = stat([x * y for x, y in zip(xs, escalated, strict=True)]).mean
            plain = sum(x for x, y in zip(xs, escalated, strict=True) if y) / sum(escalated)
            escalated_prompt = weighted / share if share > 0 and weighted > 0 else plain

        factor = censored_factor(latencies, censored)
        return cls(
            basis,
            n,
            stat([e.cost_usd for e in entries]),
            stat([float(e.completion_tokens) for e in entries]),
            stat([float(e.prompt_tokens) for e in entries]),
            censored_stat(stat([max(e.span_s, e.wire_s) for e in entries]), factor),
            censored_stat(stat([e.wire_s for e in entries]), factor),
            sum(e.attempts for e in entries) / n,
            min(1.0, max(0.0, share_stat.mean)),
            sum(e.outcome == "failed" for e in entries) / n,
            kaplan_meier(latencies, censored) if latencies else None,
            escalated_prompt,
            max(share_stat.se, share_sd(int(sum(escalated)), n)),
        )

    @classmethod
    def prior(
        cls, max_tokens: int, prompt_est: float, prices: Prices | None, escalates: bool
    ) -> Profile:
        """The stated prior for a lane without answers; `escalates`: its truncated answers
        go on to a longer lane (else they are answers like any other)."""
        completion = PRIOR_LENGTH_SHARE * max_tokens
        seconds = PRIOR_TTFT_S + completion / PRIOR_TOKENS_PER_S
        s = math.sqrt(math.log1p(PRIOR_LENGTH_CV**2))
        mu = math.log(completion) - s * s / 2
        # The band: the mean length at its p10 and p90, the speed at its slow and fast ends;
        # the share truncated and the dollars follow the length.
        short = completion / PRIOR_LENGTH_BAND
        long_ = min(float(max_tokens), completion * PRIOR_LENGTH_BAND)
        fast = PRIOR_TOKENS_PER_S * PRIOR_SPEED_BAND
        slow = PRIOR_TOKENS_PER_S / PRIOR_SPEED_BAND
        cost = None
        usd_band = None
        if prices is not None:
            usd = prices.cost(round(prompt_est), round(completion))
            cost = Stat(usd, usd * PRIOR_LENGTH_CV, 0)
            usd_band = (
                prices.cost(round(prompt_est), round(short)),
                prices.cost(round(prompt_est), round(long_)),
            )
        band = PriorBand(
            usd_band,
            (
                PRIOR_TTFT_S / PRIOR_SPEED_BAND + short / fast,
                PRIOR_TTFT_S * PRIOR_SPEED_BAND + long_ / slow,
            ),
            # Lengths beyond max_tokens are what is truncated: the share is not capped.
            (
                _truncated(short, max_tokens) if escalates else 0.0,
                _truncated(completion * PRIOR_LENGTH_BAND, max_tokens) if escalates else 0.0,
            ),
        )
        # Quantiles of the prior's latency, for the drain of a lane's last requests.
        rng = random.Random(0)
        sample = [PRIOR_TTFT_S + rng.lognormvariate(mu, s) / PRIOR_TOKENS_PER_S for _ in range(400)]
        return cls(
            f"no answers: prior (max_tokens x {PRIOR_LENGTH_SHARE:g}, "
            f"{PRIOR_TOKENS_PER_S:g} tok/s)",
            0,
            cost,
            Stat(completion, completion * PRIOR_LENGTH_CV, 0),
            Stat(prompt_est, 0.0, 0),
            Stat(seconds, seconds * PRIOR_LENGTH_CV, 0),
            Stat(seconds, seconds * PRIOR_LENGTH_CV, 0),
            1.0,
            _truncated(completion, max_tokens) if escalates else 0.0,
            0.0,
            kaplan_meier(sample, []),
            band=band,
        )


def censored_factor(done: Sequence[float], censored: Sequence[float]) -> float:
    """How much longer a lane's answers take than its finished ones say, once the answers
    cut short while still running count as lasting at least as long as they ran: the mean of
    the Kaplan-Meier curve with them over the mean without (the ETA's one estimator, its
    fitted tail included). 1.0 without censored times."""
    if not done or not censored:
        return 1.0
    with_cut, without = kaplan_meier(done, censored), kaplan_meier(done, [])
    if with_cut is None or without is None or without.mean <= 0:
        return 1.0
    return max(1.0, with_cut.mean / without.mean)


def at_least(prior: Profile, censored: Sequence[float]) -> Profile:
    """A prior for a lane whose every answer was cut off still running: its time per answer
    is no less than theirs on average (each lasted at least as long as it ran), its band
    stretched alike."""
    if not censored:
        return prior
    floor = sum(censored) / len(censored)
    k = floor / prior.wire_s.mean if prior.wire_s.mean > 0 else 1.0
    if k <= 1.0:
        return prior
    band = prior.band
    if band is not None:
        band = replace(band, seconds=(band.seconds[0] * k, band.seconds[1] * k))
    return replace(
        prior,
        basis=f"{prior.basis}; at least {format_duration(floor)}, as {len(censored)} cut off",
        wire_s=Stat(prior.wire_s.mean * k, prior.wire_s.sd * k, 0),
        held_s=Stat(prior.held_s.mean * k, prior.held_s.sd * k, 0),
        band=band,
    )


def censored_stat(st: Stat, factor: float) -> Stat:
    """A time per passage lengthened by `factor` (censored_factor). What the correction adds
    rests on times never seen to their end: it is unsure by as much as it adds (its error
    joins the mean's)."""
    if factor <= 1.0:
        return st
    added = (factor - 1.0) * st.mean
    return Stat(st.mean * factor, st.sd * factor, st.n, math.hypot(st.se * factor, added))


@dataclass(frozen=True, slots=True)
class PriorBand:
    """Per passage of a lane without answers: the p10 and p90 of its dollars, seconds (on the
    wire and held alike) and share escalated, as the prior's guess may be off."""

    cost_usd: tuple[float, float] | None
    seconds: tuple[float, float]
    escalated: tuple[float, float]


def _truncated(mean: float, max_tokens: int) -> float:
    """The share of answers a log-normal of lengths (this mean, PRIOR_LENGTH_CV) cuts at
    max_tokens."""
    s = math.sqrt(math.log1p(PRIOR_LENGTH_CV**2))
    mu = math.log(mean) - s * s / 2
    return 0.5 * math.erfc((math.log(max_tokens) - mu) / (s * math.sqrt(2)))


def share_sd(k: int, n: int) -> float:
    """The sd of a share seen k times in n (the Jeffreys beta posterior's): never zero, so a
    pilot that saw no truncated answer, or only truncated ones, does not claim to know."""
    a, b = k + 0.5, n - k + 0.5
    return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))


@dataclass(frozen=True, slots=True)
class FlowPlan:
    """One dataset in one lane, from here."""

    lane: str
    dataset: str
    basis: str
    pending: int
    """Items of the dataset waiting in this lane now."""
    passages: float
    """Expected passages: pending here, escalated in from shorter lanes, cut by budgets."""
    attempts: float
    escalations: Interval
    """Passages expected to go on to a longer lane."""
    failures: float
    prompt_tokens: float
    completion_tokens: float
    cost_usd: Interval | None
    time_s: Interval
    """Time the lane spends on it (its share of the lane's workers)."""


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    """One dataset, from here, over its lanes."""

    name: str
    items: int
    pending: int
    sent: int
    """Pending items expected to be sent (fewer when a budget or cap stops it)."""
    basis: str
    attempts: float
    escalations: Interval
    prompt_tokens: float
    completion_tokens: float
    cost_usd: Interval | None
    done_in_s: Interval | None
    """When its last lane is through with it."""
    stop: str | None = None
    """What stops it before its last item, and when."""


@dataclass(frozen=True, slots=True)
class LanePlan:
    name: str
    concurrency: int
    on_wire: float | None
    """Requests the provider is expected to let it keep on the wire, when capacity binds."""
    on_wire_basis: str
    passages: float
    attempts: float
    escalations_in: Interval
    cost_usd: Interval | None
    time_s: Interval
    basis: str


@dataclass(frozen=True)
class JobPlan:
    """The whole estimate."""

    flows: list[FlowPlan]
    datasets: list[DatasetPlan]
    lanes: list[LanePlan]
    cost_usd: Interval | None
    time_s: Interval | None
    stop: str
    """Which budget or cap ends the job, and when; or that every item is expected to finish."""
    assumptions: list[str] = field(default_factory=list)
    kill_margin_usd: float | None = None
    """What a killed run's requests in flight may cost at most: each lane's concurrency at
    max_tokens and its prompts' bound, at the highest prices (None: no price known)."""
    repay_usd: float | None = None
    """Of the expected cost, what pays truncated first tries whose items go on to a longer
    lane (paid again there)."""
    unsent: int = 0
    """Items the job's cap or the credit is expected to leave unsent."""
    unsent_sd: dict[str, float] | None = None
    """Per dataset, the standard deviation its dollars per item put on `unsent` (None: the
    room is expected to last; empty: nothing measured to be unsure of)."""
    caching: CacheSaving | None = None
    """Every item to come with the provider's prompt cache and without it (None: no price)."""


@dataclass(frozen=True, slots=True)
class CacheSaving:
    """What every item to come is expected to cost with the provider's prompt cache and
    without it, and the share of its prompt tokens expected to be read from the cache."""

    with_usd: float
    without_usd: float
    share: float
    listed: bool
    """The endpoint lists a cache read price (without one, no saving is assumed)."""
    by_dataset: dict[str, float] = field(default_factory=dict)
    """What it saves per dataset."""

    @property
    def saved_usd(self) -> float:
        return self.without_usd - self.with_usd


def _order(job: Job) -> list[LaneConfig]:
    """Lanes with the lanes that escalate to a lane before it."""
    by_name = {lane.name: lane for lane in job.lane_list}
    return [by_name[n] for n in escalation_order({n: c.escalate_to for n, c in by_name.items()})]


def _profiles(
    job: Job,
    entries: Iterable[FlowEntry],
    latencies: dict[str, list[float]],
    pending: dict[tuple[str | None, str], tuple[int, int]],
    prices: Prices | None,
    censored: Mapping[str, Sequence[float]],
    caching: dict[tuple[str, str], FlowCache] | None = None,
) -> dict[tuple[str, str], Profile]:
    """A profile for every (lane, dataset) of the job; `censored`: per lane, its times known
    only as lower bounds; its dollars with what a prompt cache is expected to serve of it
    (`caching`)."""
    by_flow: dict[tuple[str, str], list[FlowEntry]] = {}
    by_lane: dict[str, list[FlowEntry]] = {}
    for e in entries:
        if e.lane is None:
            continue
        by_flow.setdefault((e.lane, e.dataset), []).append(e)
        by_lane.setdefault(e.lane, []).append(e)
    out: dict[tuple[str, str], Profile] = {}
    for lane in _order(job):
        pooled = by_lane.get(lane.name, [])
        for ds in job.datasets:
            own = by_flow.get((lane.name, ds.name), [])
            lat = latencies.get(lane.name, [])
            cut = censored.get(lane.name, ())
            # The prompts to come: those pending here, and those the lanes escalating here
            # are expected to send on (the truncated ones, whose prompts run longer).
            n, est = pending.get((lane.name, ds.name), (0, 0))
            weight, total = float(n), float(est)
            for src in job.lane_list:
                source = out.get((src.name, ds.name))
                if src.escalate_to != lane.name or source is None:
                    continue
                if source.escalated_prompt is not None:
                    k = pending.get((src.name, ds.name), (0, 0))[0]
                    weight += k * source.escalated
                    total += k * source.escalated * source.escalated_prompt
            to: float | None = total / weight if weight > 0 else None
            if len(own) >= MIN_PASSAGES:
                prof = Profile.measured(f"{len(own)} answers", own, lat, to, cut)
            elif pooled:
                basis = f"{len(pooled)} answers of lane {lane.name}"
                prof = Profile.measured(basis, pooled, lat, to, cut)
                if len(own) >= MIN_OWN:
                    mine = Profile.measured(f"{len(own)} answers", own, lat, to, cut)
                    prof = mine if _differs(mine, prof) else prof
            else:
                prof = Profile.prior(
                    job.lane_max_tokens(lane), to or 0.0, prices, lane.escalate_to is not None
                )
                prof = at_least(prof, cut)
            out[lane.name, ds.name] = prof
    return _cache_priced(out, caching, prices)


def _cache_priced(
    profiles: dict[tuple[str, str], Profile],
    caching: dict[tuple[str, str], FlowCache] | None,
    prices: Prices | None,
) -> dict[tuple[str, str], Profile]:
    """Each profile's dollars per passage with the prompt cache's expected share at the
    listed cache prices, and without the cache (regen.run.caching)."""
    if prices is None or caching is None:
        return profiles
    out = {}
    for key, prof in profiles.items():
        if prof.cost_usd is None:
            out[key] = prof
            continue
        usd = prof.cost_usd
        cached, plain = per_passage(
            usd.mean, prof.prompt_tokens.mean, caching.get(key), prices, prof.band is not None
        )
        shift = cached - usd.mean
        band = prof.band
        if band is not None and band.cost_usd is not None:
            lo, hi = band.cost_usd
            band = replace(band, cost_usd=(max(0.0, lo + shift), max(0.0, hi + shift)))
        out[key] = replace(prof, cost_usd=replace(usd, mean=cached), band=band, uncached_usd=plain)
    return out


def _cache_saving(
    flows: Sequence[FlowPlan],
    profiles: dict[tuple[str, str], Profile],
    caching: dict[tuple[str, str], FlowCache] | None,
    prices: Prices | None,
) -> CacheSaving | None:
    """Every item to come with the cache and without it, the share of prompt tokens read
    from it, and per dataset what it saves."""
    if prices is None or caching is None or any(f.cost_usd is None for f in flows):
        return None
    with_usd = plain = tokens = read = 0.0
    saved: dict[str, float] = {}
    for f in flows:
        cost = f.cost_usd.mean if f.cost_usd is not None else 0.0
        key = (f.lane, f.dataset)
        uncached = profiles[key].uncached_usd
        off = 0.0 if uncached is None else f.passages * uncached - cost
        with_usd, plain = with_usd + cost, plain + cost + off
        saved[f.dataset] = saved.get(f.dataset, 0.0) + off
        share = caching[key].share if key in caching else 0.0
        tokens, read = tokens + f.prompt_tokens, read + f.prompt_tokens * share
    listed = prices.cache_read is not None and not prices.usd_per_s
    return CacheSaving(with_usd, plain, read / tokens if tokens else 0.0, listed, saved)


def by_lane(censored: Mapping[tuple[str, str], Sequence[float]]) -> dict[str, list[float]]:
    """Times known only as lower bounds, per (lane, dataset), pooled per lane."""
    out: dict[str, list[float]] = {}
    for (lane, _), ages in censored.items():
        out.setdefault(lane, []).extend(ages)
    return out


def _differs(own: Profile, pool: Profile) -> bool:
    """Whether a dataset's few passages show it unlike its lane's pool: its mean dollars or
    time on the wire more than DIFFERS_SE of its own standard errors from the pool's, and
    more than DIFFERS_FACTOR times above or below it."""
    pairs = [(own.wire_s, pool.wire_s)]
    if own.cost_usd is not None and pool.cost_usd is not None:
        pairs.append((own.cost_usd, pool.cost_usd))
    return any(
        abs(a.mean - b.mean) > DIFFERS_SE * a.se
        and max(a.mean, b.mean) > DIFFERS_FACTOR * min(a.mean, b.mean)
        for a, b in pairs
    )


def plan(
    job: Job,
    progress: list[DatasetProgress],
    entries: Iterable[FlowEntry],
    latencies: dict[str, list[float]],
    pending: dict[tuple[str | None, str], tuple[int, int]],
    prices: Prices | None,
    capacity: dict[str, LaneCapacity],
    credit_room_usd: float | None = None,
    caching: dict[tuple[str, str], FlowCache] | None = None,
    censored: Mapping[tuple[str, str], Sequence[float]] | None = None,
) -> JobPlan:
    """The plan from here. `pending`: items and their estimated prompt tokens per (lane,
    dataset); `capacity`: what providers let lanes keep on the wire; `credit_room_usd`: what
    the account can still spend before its credit (or the job's credit floor) stops the job;
    `caching`: what a prompt cache serves of each flow (None: nothing); `censored`: per (lane,
    dataset), times known only as lower bounds. In steps: each flow's passages, the share the
    budgets let through, each lane's timeline, what stops the job and when, the rows."""
    profiles = _profiles(job, entries, latencies, pending, prices, by_lane(censored or {}), caching)
    lanes = _order(job)
    spent = {p.name: p for p in progress}
    counts = _passages(job, lanes, pending, profiles)
    share, stops = _budget_shares(job, lanes, spent, counts.mean, profiles)
    timeline = _Timeline.of(job, lanes, counts, share, profiles, pending, capacity)
    last = max(timeline.lane_end.values(), key=lambda b: b.mean, default=_Band())
    job_end = last.mean
    room = _room(job, progress, credit_room_usd)
    margin = kill_margin(job, pending, prices)
    total = sum((f.cost_usd.mean for f in timeline.flows if f.cost_usd is not None), 0.0)
    ending, last_fit = None, 0.0
    if room is not None and total > room[0]:
        ending, last_fit = _room_ending(
            job, lanes, pending, prices, profiles, timeline, spent, room
        )
    stop, cut_at = _job_stop(total, room, job_end, margin, ending, timeline)
    datasets = [
        _dataset_plan(ds.name, spent[ds.name], share, stops, timeline, stop, ending, cut_at)
        for ds in job.datasets
        if ds.name in spent
    ]
    clause, unsent = _unsent(ending, datasets)
    stop += clause
    total_cost = _sum_intervals([d.cost_usd for d in datasets])
    time_s, total_cost = _job_totals(timeline, last, cut_at, total_cost, room, last_fit)
    return JobPlan(
        timeline.flows,
        datasets,
        timeline.lanes,
        total_cost,
        time_s,
        stop,
        _assumptions(job, profiles, timeline.lanes),
        margin,
        _repay(timeline.flows, job),
        unsent,
        None if ending is None else ending.unsent_sd,
        _cache_saving(timeline.flows, profiles, caching, prices),
    )


def _room_ending(
    job: Job,
    lanes: list[LaneConfig],
    pending: dict[tuple[str | None, str], tuple[int, int]],
    prices: Prices | None,
    profiles: dict[tuple[str, str], Profile],
    timeline: _Timeline,
    spent: dict[str, DatasetProgress],
    room: tuple[float, str],
) -> tuple[Ending | None, float]:
    """How the run ends when the room runs out first, played out flow by flow, and the worst
    case of one request (the room the run leaves unspent)."""
    # The run's last request is admitted only while its worst case fits: it ends with
    # about one worst case of the room unspent.
    last_fit = max((worst_cases(job, pending, prices) or {}).values(), default=0.0)
    order = _run_order(job, lanes, pending, profiles, timeline)
    return play(*order, max(0.0, room[0] - last_fit), _budgets_left(job, spent)), last_fit


def _unsent(ending: Ending | None, datasets: list[DatasetPlan]) -> tuple[str, int]:
    """When the room ends the run first, the items it leaves unsent, and what the stop line
    adds: them per dataset, and how many are escalated items whose first try is paid."""
    if ending is None:
        return "", 0
    short = [d for d in datasets if round(ending.unsent.get(d.name, 0.0))]
    # The sum of the counts named per dataset, so that the line adds up.
    unsent = sum(round(n) for n in ending.unsent.values())
    paid = round(sum(ending.escalated.values()))
    if not short:
        return "", unsent
    names = ", ".join(f"{d.name} ({round(ending.unsent[d.name])})" for d in short)
    clause = f"; {unsent} items stay unsent: {names}"
    if ending.unsent_range is not None:
        low, high = (round(x) for x in ending.unsent_range)
        clause += (
            f" (p10-p90 {low}-{high}, as unsure as the dollars, times and shares escalated per "
            "item)"
        )
    if paid:
        clause += (
            f"; {paid} of them escalated items whose cut-off first try is paid and never answered"
        )
    return clause, unsent


def _job_totals(
    timeline: _Timeline,
    last: _Band,
    cut_at: float | None,
    total_cost: Interval | None,
    room: tuple[float, str] | None,
    last_fit: float,
) -> tuple[Interval | None, Interval | None]:
    """The job's time and cost. When it stops at `cut_at`: the time scaled to the cut, the
    cost what the room lets it spend (about one worst case short of the room)."""
    time_s = last.interval() if timeline.flows else None
    if cut_at is None:
        return time_s, total_cost
    job_end = last.mean
    time_s = (
        last.scaled(cut_at / job_end).interval() if job_end else Interval(cut_at, cut_at, cut_at)
    )
    if total_cost is not None and room is not None:
        usd = max(0.0, room[0] - last_fit)
        total_cost = Interval(usd, min(total_cost.p10, usd), room[0])
    return time_s, total_cost


def kill_margin(
    job: Job, pending: dict[tuple[str | None, str], tuple[int, int]], prices: Prices | None
) -> float | None:
    """The most a killed run's requests in flight may cost: per lane, its concurrency times one
    request's worst case (worst_cases). None without prices."""
    worst = worst_cases(job, pending, prices)
    if worst is None:
        return None
    return sum(lane.concurrency * worst[lane.name] for lane in job.lane_list)


def worst_cases(
    job: Job, pending: dict[tuple[str | None, str], tuple[int, int]], prices: Prices | None
) -> dict[str, float] | None:
    """Per lane, what admission reserves for one request: max_tokens and the bound of its
    pending prompts at their mean (of all pending prompts for a lane fed by escalations), at
    the highest prices. None without prices."""
    if prices is None:
        return None

    def mean_est(keys: Iterable[tuple[str | None, str]]) -> float:
        n = sum(pending[k][0] for k in keys)
        return sum(pending[k][1] for k in keys) / n if n else 0.0

    overall = mean_est(pending)
    out = {}
    for lane in job.lane_list:
        own = [k for k in pending if k[0] == lane.name]
        prompt = BOUND_PER_EST * (mean_est(own) if own else overall) + BOUND_OVERHEAD
        out[lane.name] = prices.cost(round(prompt), job.lane_max_tokens(lane))
    return out


def _repay(flows: Sequence[FlowPlan], job: Job) -> float | None:
    """Expected dollars of first tries cut at max_tokens and sent on to a longer lane."""
    escalating = {lane.name for lane in job.lane_list if lane.escalate_to is not None}
    total = 0.0
    for f in flows:
        if f.lane not in escalating or f.passages <= 0:
            continue
        if f.cost_usd is None:
            return None
        total += f.escalations.mean * f.cost_usd.mean / f.passages
    return total


@dataclass(frozen=True, slots=True)
class _Counts:
    """Expected passages per flow: the mean, the variance the measured escalation shares give
    it, and the p10-p90 the prior's put around it."""

    mean: dict[tuple[str, str], float]
    var: dict[tuple[str, str], float]
    band: dict[tuple[str, str], tuple[float, float]]


def _passages(
    job: Job,
    lanes: list[LaneConfig],
    pending: dict[tuple[str | None, str], tuple[int, int]],
    profiles: dict[tuple[str, str], Profile],
) -> _Counts:
    """Passages per flow before budgets, lanes in escalation order: a lane's pending items and
    the share of the lanes escalating to it that come back truncated; and how unsure that
    count is (the escalated share is a sample's or a prior's, and each passage a draw)."""
    out = _Counts({}, {}, {})
    for lane in lanes:
        for ds in job.datasets:
            n = float(pending.get((lane.name, ds.name), (0, 0))[0])
            var, lo, hi = 0.0, n, n
            for src in lanes:
                if src.escalate_to != lane.name:
                    continue
                key = (src.name, ds.name)
                k, prof = out.mean.get(key, 0.0), profiles[key]
                n += k * prof.escalated
                var += _escalated_var(k, out.var.get(key, 0.0), prof)
                k_lo, k_hi = out.band.get(key, (k, k))
                p_lo, p_hi = prof.band.escalated if prof.band else (prof.escalated,) * 2
                lo, hi = lo + k_lo * p_lo, hi + k_hi * p_hi
            out.mean[lane.name, ds.name] = n
            out.var[lane.name, ds.name] = var
            out.band[lane.name, ds.name] = (lo, hi)
    return out


def _escalated_var(k: float, k_var: float, prof: Profile) -> float:
    """The variance of how many of k passages (itself unsure by k_var) a profile escalates:
    each passage a Bernoulli draw, the share unsure by its sd, and k by its own."""
    p, p_sd = prof.escalated, prof.escalated_sd
    return k * p * (1 - p) + (k * p_sd) ** 2 + k_var * (p * p + p_sd * p_sd)


def _budget_shares(
    job: Job,
    lanes: list[LaneConfig],
    spent: dict[str, DatasetProgress],
    passages: dict[tuple[str, str], float],
    profiles: dict[tuple[str, str], Profile],
) -> tuple[dict[str, float], dict[str, str]]:
    """The share of each dataset's passages its budgets let through, and which budget stops
    the datasets that do not get them all."""
    count_total = job.budget.budget_tokens == "total"
    share: dict[str, float] = {}
    stops: dict[str, str] = {}
    for ds in job.datasets:
        p = spent.get(ds.name)
        flows = [(passages[lane.name, ds.name], profiles[lane.name, ds.name]) for lane in lanes]
        f = 1.0
        if ds.token_budget is not None and p is not None:
            used = p.prompt_tokens + p.completion_tokens if count_total else p.completion_tokens
            per = sum(
                n * (prof.completion_tokens.mean + (prof.prompt_tokens.mean if count_total else 0))
                for n, prof in flows
            )
            if per > 0 and (ds.token_budget - used) / per < f:
                f = max(0.0, (ds.token_budget - used) / per)
                stops[ds.name] = "its token budget"
        if ds.max_cost_usd is not None and p is not None:
            usd = sum(n * prof.cost_usd.mean for n, prof in flows if prof.cost_usd is not None)
            if usd > 0 and (ds.max_cost_usd - p.cost_usd) / usd < f:
                f = max(0.0, (ds.max_cost_usd - p.cost_usd) / usd)
                stops[ds.name] = "its dollar cap"
        share[ds.name] = f
    return share, stops


@dataclass
class _LaneFlows:
    """One lane's flows as they are planned, dataset by dataset."""

    rows: list[FlowPlan] = field(default_factory=list)
    elapsed: _Band = field(default_factory=lambda: _Band())
    """Lane time from now to the end of the latest flow planned."""
    total_n: float = 0.0
    """Passages through the lane, all datasets."""
    last: Profile | None = None
    """The profile of the last dataset with passages (its latencies drain the lane)."""
    escalated_in: list[Interval] = field(default_factory=list)


@dataclass
class _Timeline:
    """The lanes' timelines as they are planned, lane by lane in escalation order."""

    flows: list[FlowPlan] = field(default_factory=list)
    lanes: list[LanePlan] = field(default_factory=list)
    on_wire: dict[str, float] = field(default_factory=dict)
    """Requests each lane may keep on the wire."""
    drain_s: float = 0.0
    """How long the slowest lane's last requests take to come back once nothing more goes."""
    lane_end: dict[str, _Band] = field(default_factory=dict)
    flow_end: dict[tuple[str, str], _Band] = field(default_factory=dict)
    """When each lane is through with each dataset, from now."""

    @classmethod
    def of(
        cls,
        job: Job,
        lanes: list[LaneConfig],
        counts: _Counts,
        share: dict[str, float],
        profiles: dict[tuple[str, str], Profile],
        pending: dict[tuple[str | None, str], tuple[int, int]],
        capacity: dict[str, LaneCapacity],
    ) -> _Timeline:
        """Every lane planned, in escalation order (a lane's end waits on those feeding it)."""
        timeline = cls()
        for lane in lanes:
            timeline.add(job, lane, lanes, counts, share, profiles, pending, capacity)
        return timeline

    def add(
        self,
        job: Job,
        lane: LaneConfig,
        lanes: list[LaneConfig],
        counts: _Counts,
        share: dict[str, float],
        profiles: dict[tuple[str, str], Profile],
        pending: dict[tuple[str | None, str], tuple[int, int]],
        capacity: dict[str, LaneCapacity],
    ) -> None:
        """Plan one lane: its datasets in order, each at the rate of the slower of its two
        bounds (slots held, requests on the wire), then the drain of its last requests."""
        limit, limit_basis = on_wire_for(lane, capacity.get(lane.name))
        on_wire = min(float(lane.concurrency), limit) if limit else float(lane.concurrency)
        self.on_wire[lane.name] = on_wire
        run = _LaneFlows()
        for ds in job.datasets:
            key = (lane.name, ds.name)
            self._add_flow(run, lane, key, counts, share[ds.name], profiles[key], pending, limit)
        end = self._lane_end(lane, lanes, run)
        # The lane's last dataset ends with the lane; an earlier one when the next begins.
        final = next((r for r in reversed(run.rows) if r.passages > 0), None)
        if final is not None:
            self.flow_end[lane.name, final.dataset] = end
        bases = sorted({r.basis for r in run.rows})
        self.lanes.append(
            LanePlan(
                lane.name,
                lane.concurrency,
                limit,
                limit_basis,
                run.total_n,
                sum(r.attempts for r in run.rows),
                _sum(run.escalated_in),
                _sum_intervals([r.cost_usd for r in run.rows]) if run.rows else None,
                end.interval(),
                "; ".join(bases),
            )
        )
        self.flows.extend(run.rows)

    def _add_flow(
        self,
        run: _LaneFlows,
        lane: LaneConfig,
        key: tuple[str, str],
        counts: _Counts,
        k: float,
        prof: Profile,
        pending: dict[tuple[str | None, str], tuple[int, int]],
        limit: float | None,
    ) -> None:
        """One dataset's flow through the lane, after those before it: `k` is its share of
        the passages; nothing when it has none and nothing is pending."""
        on_wire = self.on_wire[lane.name]
        n = counts.mean[key] * k
        if n <= 0 and not pending.get(key):
            return
        lo, hi = (x * k for x in counts.band[key])
        row, took = _flow_row(
            lane,
            key[1],
            pending.get(key, (0, 0))[0],
            prof,
            (n, math.sqrt(counts.var[key]) * k, lo, hi),
            on_wire,
            bool(limit),
        )
        run.rows.append(row)
        run.elapsed += took
        self.flow_end[key] = _paced(run.elapsed)
        run.total_n += n
        came = pending.get(key, (0, 0))[0] * k
        run.escalated_in.append(
            _Band.spread(n - came, math.sqrt(counts.var[key]) * k, lo - came, hi - came).interval()
        )
        if n > 0:
            run.last = prof

    def _lane_end(self, lane: LaneConfig, lanes: list[LaneConfig], run: _LaneFlows) -> _Band:
        """When the lane is through: its drain, and no sooner than one answer after the last
        of the lanes that escalate into it."""
        on_wire, last, total_n = self.on_wire[lane.name], run.last, run.total_n
        end = self._drain(run.elapsed, last, on_wire, total_n)
        if last is not None and last.latency is not None and total_n > 0:
            slowest = last.latency.drain(max(1, round(min(on_wire, total_n))))[0]
            self.drain_s = max(self.drain_s, slowest)
        for src in lanes:
            if src.escalate_to == lane.name and src.name in self.lane_end and total_n > 0:
                fed = self.lane_end[src.name]
                one = last.latency.mean if last is not None and last.latency else 0.0
                if fed.mean + one > end.mean:
                    end = _Band(fed.mean + one, fed.var, fed.down, fed.up)
        end = _paced(end)
        self.lane_end[lane.name] = end
        return end

    @staticmethod
    def _drain(elapsed: _Band, last: Profile | None, on_wire: float, total_n: float) -> _Band:
        """The lane's end: its last requests drain, the slowest of those left in flight. The
        fluid time counts each of them as a share of a slot; the drain replaces its last wave
        (stretched as the prior's seconds are, for a lane without answers)."""
        if last is None or last.latency is None or total_n <= 0:
            return elapsed
        model = last.latency
        drain, drain_sd = model.drain(max(1, round(min(on_wire, total_n))))
        wave = min(min(total_n, on_wire) * model.mean / on_wire, elapsed.mean)
        low, high = 1.0, 1.0
        if last.band is not None:
            low, high = (x / last.wire_s.mean for x in last.band.seconds)
        # Both stretch as the prior's seconds do.
        less = _Band(wave, 0.0, wave * (1 - low), wave * (high - 1))
        end = _Band(
            elapsed.mean - less.mean, elapsed.var, elapsed.down - less.down, elapsed.up - less.up
        )
        return end + _Band.spread(drain, drain_sd, drain * low, drain * high)


def _paced(b: _Band) -> _Band:
    """A time with the lane's pace unsure by PACE_RSD (once: it moves every flow alike)."""
    return _Band(b.mean, b.var + (b.mean * PACE_RSD) ** 2, b.down, b.up)


def seconds_per_passage(lane: LaneConfig, prof: Profile, on_wire: float) -> float:
    """Lane time one passage takes: its time held over the lane's workers, or on the wire over
    what the lane may keep there, whichever is slower."""
    return max(prof.held_s.mean / lane.concurrency, prof.wire_s.mean / on_wire)


def _flow_row(
    lane: LaneConfig,
    dataset: str,
    pending: int,
    prof: Profile,
    passages: tuple[float, float, float, float],
    on_wire: float,
    limited: bool,
) -> tuple[FlowPlan, _Band]:
    """One flow's row and the time it takes on its lane's timeline. `passages`: how many it
    is expected to take, their sd from measured escalation shares, and their p10 and p90 from
    the prior's."""
    n, n_sd, n_lo, n_hi = passages
    # The slower of the two bounds sets the rate, and its spread is that stat's.
    rate = seconds_per_passage(lane, prof, on_wire)
    slots = rate == prof.held_s.mean / lane.concurrency
    stat, width = (prof.held_s, lane.concurrency) if slots else (prof.wire_s, on_wire)
    # A prior's own error is its band; only the spread of each passage adds.
    measured = prof.band is None

    def sd(st: Stat) -> float:
        return st.total_sd(n) if measured else math.sqrt(n) * st.sd

    seconds = n * rate
    # How unsure the count of passages is (escalations to come) adds to each.
    time_sd = math.hypot(sd(stat) / width, n_sd * rate, seconds * PACE_RSD)
    if limited and stat is prof.wire_s:
        time_sd = math.hypot(time_sd, seconds * LIMIT_RSD)
    r_lo, r_hi = (x / width for x in prof.band.seconds) if prof.band else (rate, rate)
    took = _Band.spread(seconds, time_sd, n_lo * r_lo, n_hi * r_hi)
    cost = None
    if prof.cost_usd is not None:
        usd = prof.cost_usd
        c_lo, c_hi = prof.band.cost_usd if prof.band and prof.band.cost_usd else (usd.mean,) * 2
        cost = _Band.spread(
            n * usd.mean, math.hypot(sd(usd), n_sd * usd.mean), n_lo * c_lo, n_hi * c_hi
        ).interval()
    p_lo, p_hi = prof.band.escalated if prof.band else (prof.escalated,) * 2
    escalations = _Band.spread(
        n * prof.escalated, math.sqrt(_escalated_var(n, n_sd**2, prof)), n_lo * p_lo, n_hi * p_hi
    ).interval()
    row = FlowPlan(
        lane.name,
        dataset,
        prof.basis,
        pending,
        n,
        n * prof.attempts,
        escalations,
        n * prof.failed,
        n * prof.prompt_tokens.mean,
        n * prof.completion_tokens.mean,
        cost,
        took.interval(),
    )
    return row, took


def _dataset_plan(
    name: str,
    p: DatasetProgress,
    share: dict[str, float],
    stops: dict[str, str],
    timeline: _Timeline,
    stop: str,
    ending: Ending | None,
    cut_at: float | None,
) -> DatasetPlan:
    """A dataset's row: its flows summed, when it is done, and what stops it short (its own
    budget, or the job's cap or credit: what the run's order leaves pending when it runs out
    of room, at `cut_at`)."""
    rows = [r for r in timeline.flows if r.dataset == name]
    pending_n = p.pending
    sent = round(pending_n * share[name])
    done_in = None
    ends = [timeline.flow_end[r.lane, r.dataset] for r in rows if r.passages > 0]
    if ends:
        done_in = max(ends, key=lambda b: b.mean).interval()
    why = stops.get(name)
    note = None
    if why is not None and sent < pending_n:
        note = f"{why} stops it after ~{sent} of its {pending_n} items"
        if done_in is not None:
            note += f", in ~{format_duration(done_in.mean)}"
    if ending is not None and cut_at is not None:
        # The run's order says what its own budget and the cap leave, in place of the shares.
        sent, note = _ended_short(name, pending_n, why, stop, ending, cut_at)
    cost = _sum_intervals([r.cost_usd for r in rows])
    bases = sorted({r.basis for r in rows if r.passages > 0}) or sorted({r.basis for r in rows})
    return DatasetPlan(
        name,
        p.items,
        pending_n,
        sent,
        "; ".join(bases),
        sum(r.attempts for r in rows),
        _sum([r.escalations for r in rows]),
        sum(r.prompt_tokens for r in rows),
        sum(r.completion_tokens for r in rows),
        cost,
        done_in,
        note,
    )


def _ended_short(
    name: str, pending_n: int, why: str | None, stop: str, ending: Ending, cut_at: float
) -> tuple[int, str | None]:
    """A dataset's items sent when the run runs out of room at `cut_at`, and what stops it
    short: its own budget (`why`), or the job's cap or credit (`stop`)."""
    met = round(ending.met.get(name, 0.0))
    left = round(ending.unsent.get(name, 0.0))
    sent = max(0, pending_n - met - left)
    note = None
    if met:
        kept = pending_n - met
        note = f"{why or 'its budget'} stops it after ~{kept} of its {pending_n} items"
    if left:
        paid = round(ending.escalated.get(name, 0.0))
        note = (
            f"{stop.split(':')[0]} stops it after ~{sent} of its {pending_n} items, "
            f"in ~{format_duration(cut_at)}"
            + (f" ({paid} of those left escalated, their first try paid)" if paid else "")
            + (f"; its own budget leaves {met}" if met else "")
        )
    return sent, note


def _sum_intervals(maybe: Sequence[Interval | None]) -> Interval | None:
    """The sum of independent quantities given as intervals (their sds from p10-p90); None
    when any of them is unknown (no prices)."""
    parts = [p for p in maybe if p is not None]
    if len(parts) < len(maybe):
        return None
    return _sum(parts)


def _sum(parts: Sequence[Interval]) -> Interval:
    """The sum of quantities given as intervals: measured ones independent, the prior's
    moving together."""
    return sum((_Band.of(p) for p in parts), _Band()).interval()


@dataclass(frozen=True, slots=True)
class _Band:
    """A sum being planned: its mean, the variance of its measured parts (independent), and
    how far below and above it the prior's parts may put it (their errors move together, so
    these add up)."""

    mean: float = 0.0
    var: float = 0.0
    down: float = 0.0
    up: float = 0.0

    @classmethod
    def of(cls, iv: Interval) -> _Band:
        if iv.prior:
            return cls(iv.mean, 0.0, iv.mean - iv.p10, iv.p90 - iv.mean)
        var = 0.0
        if iv.mean > 0 and iv.p90 > iv.mean:
            s = math.log(iv.p90 / iv.mean) / Z90
            var = iv.mean**2 * math.expm1(s * s)
        return cls(iv.mean, var)

    @classmethod
    def spread(cls, mean: float, sd: float, low: float, high: float) -> _Band:
        """`mean` with its measured sd, and the prior's p10 and p90 of it (`low`, `high`)."""
        return cls(mean, sd * sd, max(0.0, mean - low), max(0.0, high - mean))

    def __add__(self, other: _Band) -> _Band:
        return _Band(
            self.mean + other.mean,
            self.var + other.var,
            self.down + other.down,
            self.up + other.up,
        )

    def scaled(self, k: float) -> _Band:
        return _Band(self.mean * k, self.var * k * k, self.down * k, self.up * k)

    def interval(self) -> Interval:
        """The measured spread, stretched over the prior's band (both are relative errors)."""
        iv = Interval.of(self.mean, math.sqrt(self.var))
        if not (self.down or self.up):
            return iv
        if self.mean <= 0:
            return Interval(0.0, 0.0, self.up, prior=True)
        low, high = max(0.0, self.mean - self.down), self.mean + self.up
        return Interval(self.mean, low * iv.p10 / self.mean, high * iv.p90 / self.mean, prior=True)


def _room(
    job: Job, progress: list[DatasetProgress], credit_room_usd: float | None
) -> tuple[float, str] | None:
    """Dollars the job can still spend, and what limits them (the job's cap or the credit)."""
    spent = sum(p.cost_usd for p in progress)
    rooms: list[tuple[float, str]] = []
    if job.budget.max_cost_usd is not None:
        rooms.append((max(0.0, job.budget.max_cost_usd - spent), "the job's dollar cap"))
    if credit_room_usd is not None:
        what = "the credit floor" if job.budget.stop_when_credits_below else "the account's credit"
        rooms.append((max(0.0, credit_room_usd), what))
    return min(rooms) if rooms else None


def _job_stop(
    total: float,
    room: tuple[float, str] | None,
    job_end: float,
    margin: float | None,
    ending: Ending | None,
    timeline: _Timeline,
) -> tuple[str, float | None]:
    """What ends the job: a sentence, and when the cap or credit stops it (None when every
    item is expected to finish first). `total`: the dollars every item is expected to take;
    `margin`: the kill margin (finishing is promised only when the room covers it too);
    `ending`: where the run's order runs out of room."""
    if room is None or total <= room[0]:
        if room is None:
            return "no dollar cap or credit limit applies: every item is expected to finish", None
        if margin is not None and total + margin > room[0]:
            return (
                f"every item is expected to finish within {room[1]} only if no run is killed: "
                f"${total:.2f} expected of ${room[0]:.2f} left, and a run killed with its "
                f"lanes full may leave up to ${margin:.2f} of requests in flight to be billed "
                f"(the kill margin); ${room[0] - margin:.2f} is what the cap covers for sure",
                None,
            )
        return (
            f"every item is expected to finish within {room[1]} "
            f"(${total:.2f} of ${room[0]:.2f} left"
            + ("" if margin is None else f", a kill margin of ${margin:.2f} included")
            + ")",
            None,
        )
    if ending is None:
        return f"{room[1]}: stops the job near its end", job_end
    # Admission stops at the crossing; the requests then in flight still finish.
    at = min(job_end, ending.at_s + timeline.drain_s)
    return (
        f"{room[1]}: stops the job after ~{format_duration(at)} of "
        f"{format_duration(job_end)}, with ${room[0]:.2f} spent (${total:.2f} "
        "expected for every item)",
        at,
    )


def _run_order(
    job: Job,
    lanes: list[LaneConfig],
    pending: dict[tuple[str | None, str], tuple[int, int]],
    profiles: dict[tuple[str, str], Profile],
    timeline: _Timeline,
) -> tuple[list[Lane], dict[tuple[str, str], Flow]]:
    """The lanes as a run hands them out (their own items in the job's order) and each flow's
    pace, dollars, tokens (as its dataset's budget counts them) and escalated share per
    passage."""
    order = [
        Lane(
            lane.name,
            [(ds.name, pending.get((lane.name, ds.name), (0, 0))[0]) for ds in job.datasets],
            lane.escalate_to,
        )
        for lane in lanes
    ]
    total = job.budget.budget_tokens == "total"
    flows = {}
    for lane in lanes:
        on_wire = timeline.on_wire[lane.name]
        for ds in job.datasets:
            prof = profiles[lane.name, ds.name]
            tokens = prof.completion_tokens.mean + (prof.prompt_tokens.mean if total else 0.0)
            seconds = seconds_per_passage(lane, prof, on_wire)
            # The error of whichever bound sets the pace (a prior's is in its band, not here).
            slots = seconds == prof.held_s.mean / lane.concurrency
            stat, width = (prof.held_s, lane.concurrency) if slots else (prof.wire_s, on_wire)
            escalates = lane.escalate_to is not None
            flows[lane.name, ds.name] = Flow(
                seconds,
                prof.cost_usd.mean if prof.cost_usd is not None else 0.0,
                prof.escalated if escalates else 0.0,
                prof.held_s.mean,
                tokens,
                prof.cost_usd.se if prof.cost_usd is not None else 0.0,
                stat.se / width if prof.band is None and stat.n else 0.0,
                prof.escalated_sd if escalates else 0.0,
            )
    return order, flows


def _budgets_left(job: Job, spent: dict[str, DatasetProgress]) -> dict[str, Budget]:
    """What each dataset's own budgets leave it: tokens and dollars."""
    total = job.budget.budget_tokens == "total"
    out = {}
    for ds in job.datasets:
        p = spent.get(ds.name)
        if p is None or (ds.token_budget is None and ds.max_cost_usd is None):
            continue
        used = p.completion_tokens + (p.prompt_tokens if total else 0)
        out[ds.name] = Budget(
            None if ds.token_budget is None else float(ds.token_budget - used),
            None if ds.max_cost_usd is None else ds.max_cost_usd - p.cost_usd,
        )
    return out


def on_wire_for(lane: LaneConfig, cap: LaneCapacity | None) -> tuple[float | None, str]:
    """Requests a lane's provider is expected to let it keep on the wire (None: its
    concurrency, nothing refused), and where the figure comes from."""
    seen = cap.on_wire() if cap is not None else None
    if cap is None or seen is None:
        return None, f"its concurrency ({lane.concurrency}): no request refused for capacity yet"
    if cap.run_measured:
        return seen, f"{seen:.0f}, kept on the wire in the last run"
    return seen, (
        f"{seen:.0f}: {ADAPTIVE_SHARE:g} of the {cap.most_answered} the provider answered at "
        f"once ({cap.refused} refused for capacity)"
    )


def _assumptions(
    job: Job, profiles: dict[tuple[str, str], Profile], lanes: list[LanePlan]
) -> list[str]:
    out = []
    for d in job.datasets:
        k = job.dataset_samples(d)
        if k > 1:
            out.append(
                f"dataset {d.name}: {k} samples per prompt, each its own item: items, tokens, "
                "dollars and time here count every sample (one sample costs an item's share)"
            )
    if any(p.passages == 0 for p in profiles.values()):
        out.append(
            f"lanes without answers assume completions of {PRIOR_LENGTH_SHARE:g} x max_tokens, "
            f"{PRIOR_TTFT_S:g} s to the first token and {PRIOR_TOKENS_PER_S:g} tokens/s "
            "(p10-p90 about /2.8 to x2.8): pass --pilot N to measure them"
        )
    for lane in lanes:
        out.append(f"lane {lane.name}: on the wire at most {lane.on_wire_basis}")
    for (lane_name, ds), p in sorted(profiles.items()):
        if 0 < p.passages < FEW_PASSAGES:
            out.append(
                f"lane {lane_name}, dataset {ds}: rests on {p.passages} answers; a larger "
                "--pilot narrows it (a lane fed by escalations gets only the truncated share)"
            )
    return out


def coverage(
    datasets: list[DatasetPlan], credit_usd: float | None, job_room_usd: float | None
) -> str | None:
    """Which datasets the money left covers, in the job's order: the remaining credit or the
    job's dollar cap, whichever is smaller."""
    named = ((credit_usd, "remaining"), (job_room_usd, "left under the job's cap"))
    limits = [(v, what) for v, what in named if v is not None]
    if not limits:
        return None
    room, what = min(limits)
    covered: list[str] = []
    total = 0.0
    for d in datasets:
        if d.cost_usd is None:
            return None
        if total + d.cost_usd.mean > room:
            per_item = d.cost_usd.mean / d.sent if d.sent else 0.0
            n = int((room - total) / per_item) if per_item else 0
            head = f"${room:.2f} {what} covers {', '.join(covered)}; " if covered else ""
            return (
                f"{head}{d.name} will stop after ~{n} of its {d.sent} items "
                f"({'credit' if what == 'remaining' else 'job cap'})"
            )
        total += d.cost_usd.mean
        covered.append(d.name)
    return f"${room:.2f} {what} covers every dataset (expected ${total:.2f})"
