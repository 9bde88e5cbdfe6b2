"""Cost and time to finish: what the answers so far say the rest of a job will take.

Per dataset, the means of its own answers (tokens and cost per item from the ledger, latency
from the results, billed prompt tokens per estimated prompt token) apply to its pending items.
A dataset without answers borrows the means of the others; with none anywhere, a completion is
taken as max_tokens/4 and priced at the endpoint's prices. Budgets cut a dataset's expectation
where they will stop it. Time assumes the provider keeps up with the lane's concurrency
(Little's law: items x mean latency / concurrency).
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.budget import Prices
from regen.config import Job
from regen.store import DatasetProgress, DatasetSample


@dataclass(frozen=True, slots=True)
class Means:
    """Per-item means of done answers."""

    items: int
    completion_tokens: float
    prompt_per_est: float
    """Billed prompt tokens per estimated prompt token."""
    cost_usd: float
    latency_s: float

    @classmethod
    def of(cls, progress: list[DatasetProgress], samples: list[DatasetSample]) -> Means | None:
        done = sum(p.done for p in progress)
        if done == 0:
            return None
        est = sum(s.done_prompt_est for s in samples)
        return cls(
            done,
            sum(p.completion_tokens for p in progress) / done,
            sum(p.prompt_tokens for p in progress) / est if est else 1.0,
            sum(p.cost_usd for p in progress) / done,
            sum(s.latency_s for s in samples) / done,
        )


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one dataset is expected to take from here."""

    name: str
    items: int
    pending: int
    basis: str
    """Where the means come from."""
    sent: int
    """Pending items expected to be sent (fewer than pending when a budget stops it)."""
    completion_tokens: float
    prompt_tokens: float
    cost_usd: float | None
    time_s: float | None
    lane: str | None
    budget_note: str | None = None


def estimate(
    job: Job,
    progress: list[DatasetProgress],
    samples: dict[str, DatasetSample],
    prices: Prices | None,
) -> list[Estimate]:
    """An estimate for each of the job's datasets, in the job's order."""
    by_name = {p.name: p for p in progress}
    empty = DatasetSample("", 0, 0, 0, 0.0)
    pooled = Means.of(progress, list(samples.values()))
    count_total = job.budget.budget_tokens == "total"
    out = []
    for ds in job.datasets:
        p = by_name.get(ds.name)
        s = samples.get(ds.name, empty)
        if p is None:
            continue
        lane = next(
            (lane for lane in job.lane_list if lane.datasets is None or ds.name in lane.datasets),
            None,
        )
        max_tokens = job.lane_max_tokens(lane) if lane else job.generation.max_tokens
        own = Means.of([p], [s])
        means = own or pooled
        if own is not None:
            basis = f"{own.items} answers"
        elif pooled is not None:
            basis = f"{pooled.items} answers of other datasets"
        else:
            basis = "no answers yet: max_tokens/4"
        completion = means.completion_tokens if means else max_tokens / 4
        prompt = (s.pending_prompt_est / s.pending if s.pending else 0.0) * (
            means.prompt_per_est if means else 1.0
        )
        cost: float | None = None
        if means is not None:
            cost = means.cost_usd
        elif prices is not None:  # the highest prices: an upper bound
            cost = prices.cost(round(prompt), round(completion))
        sent, note = _budget_cut(
            ds.token_budget, ds.max_cost_usd, p, s.pending, completion, prompt, cost, count_total
        )
        time_s = None
        if means is not None and lane is not None:
            time_s = sent * means.latency_s / lane.concurrency
        out.append(
            Estimate(
                ds.name,
                p.items,
                s.pending,
                basis,
                sent,
                sent * completion,
                sent * prompt,
                None if cost is None else sent * cost,
                time_s,
                lane.name if lane else None,
                note,
            )
        )
    return out


def _budget_cut(
    token_budget: int | None,
    max_cost_usd: float | None,
    p: DatasetProgress,
    pending: int,
    completion: float,
    prompt: float,
    cost: float | None,
    count_total: bool,
) -> tuple[int, str | None]:
    """How many pending items the dataset's budgets let through, and why fewer if so."""
    sent, note = pending, None
    if token_budget is not None and completion > 0:
        spent = p.prompt_tokens + p.completion_tokens if count_total else p.completion_tokens
        per_item = completion + prompt if count_total else completion
        room = max(0, int((token_budget - spent) / per_item))
        if room < sent:
            sent, note = room, f"token budget: ~{room} more"
    if max_cost_usd is not None and cost:
        room = max(0, int((max_cost_usd - p.cost_usd) / cost))
        if room < sent:
            sent, note = room, f"dollar cap: ~{room} more"
    return sent, note


def coverage(
    estimates: list[Estimate], credit_usd: float | None, job_room_usd: float | None
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
    for e in estimates:
        if e.cost_usd is None:
            return None
        if total + e.cost_usd > room:
            per_item = e.cost_usd / e.sent if e.sent else 0.0
            n = int((room - total) / per_item) if per_item else 0
            head = f"${room:.2f} {what} covers {', '.join(covered)}; " if covered else ""
            return (
                f"{head}{e.name} will stop after ~{n} of its {e.sent} items "
                f"({'credit' if what == 'remaining' else 'job cap'})"
            )
        total += e.cost_usd
        covered.append(e.name)
    return f"${room:.2f} {what} covers every dataset (expected ${total:.2f})"
