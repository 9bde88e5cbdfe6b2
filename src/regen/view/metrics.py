"""Prometheus metrics of a running job (`regen run --metrics-port N`).

Nothing is counted twice: a collector reads the run's live counters (`RunStats`) when it is
scraped, so the request path pays nothing for metrics but one bucket increment per answer.
The endpoint listens on 127.0.0.1 unless `[run] metrics_host` says otherwise.

Two scopes, told apart by the name (never by a label, so that `sum()` over any metric means
something):

- `regen_<thing>_total`: the job's totals, which survive resumes. Each is what state.db held
  when the run started (`DatasetStats.before`) plus what this run counted since, so it agrees
  with `regen status` once the run has committed what it counted, and a resumed run carries
  on from where the last one stopped instead of dropping to zero. Every one only goes up, in
  a run and across resumes, because each counts something state.db never takes back: done
  answers (a done item never goes back to pending), the ledger's tokens and dollars, and the
  attempt log's failed attempts (both tables are only ever appended to).
- `regen_run_<thing>_total`: this run (this process) only; zero at each start, as a process's
  counters usually are, and only up from there.

Failed items are a state, not an event: a resume gives items that failed for a transient
reason another chance (they are pending again), so the job's failed count can go down, as
`regen status`'s does. A counter that goes down reads to Prometheus as a reset and corrupts
rate() and increase(), so that count is only the gauge `regen_items{state="failed"}`. The
job's failure signal that only goes up is `regen_attempt_errors_total{class}`; items given up
on in this run are `regen_run_answers_total{outcome="failed"}`, which a resume does not touch
(the run starts from zero). `regen_answers_total` has no `outcome` label at all, rather than
one that is always `done`: a label with a single value says nothing, and a `done` beside no
`failed` series would read as "no failures" to `sum by (outcome)`. (A total can dip at a
resume only by what a run counted but never saved, killed before its commit or on a full
disk: the next run sends those items again and counts them then.)

Gauges say what is true now (items by state count the job, like `regen status`); the latency
histogram, elapsed time and start time are this run's. Names follow Prometheus's naming
practice: snake_case, base units in the name (`_seconds`, `_usd` for dollars, `_tokens`),
`_total` on counters only. `tests/view/test_metrics.py` checks every emitted name against those
rules and every name that `docs/grafana-dashboard.json` uses against what is emitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from regen import __version__
from regen.engine.stats import LATENCY_BUCKETS, DatasetStats, EndpointStats, JobTotals, RunStats
from regen.safe import redact

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ETA_QUANTILES = ("0.1", "0.5", "0.9")


class RunCollector(Collector):
    """The run's counters as metric families, read at scrape time."""

    def __init__(self, stats: RunStats) -> None:
        self._stats = stats
        # RunStats keeps a monotonic start; its wall-clock time is fixed once, here, so the
        # gauge does not wobble between scrapes.
        self._start_unix = time.time() - (time.monotonic() - stats.started_at)

    def collect(self) -> Iterator[Metric]:
        yield from self._datasets()
        yield from self._lanes()
        yield from self._run()

    def _datasets(self) -> Iterator[Metric]:
        """Per dataset: items by state, and answers, tokens, dollars and failed attempts, for
        the job (regen_*_total) and for this run (regen_run_*_total)."""
        f = _families(_DATASET_FAMILIES)
        for name, d in self._stats.datasets.items():
            _add_dataset(f, name, d)
        yield from f.values()

    def _lanes(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "regen_requests_in_flight", "Requests of a lane on the wire now", labels=["lane"]
        )
        limit = GaugeMetricFamily(
            "regen_concurrency_limit",
            "The lane's adaptive concurrency limit now (requests)",
            labels=["lane"],
        )
        configured = GaugeMetricFamily(
            "regen_concurrency_configured",
            "The lane's configured concurrency (requests)",
            labels=["lane"],
        )
        waiting = GaugeMetricFamily(
            "regen_items_waiting_for_budget",
            "Items of a lane waiting for a token budget's or dollar cap's room, held by requests "
            "in flight or by bills not known yet (neither sent nor idle), by what holds it",
            labels=["lane", "held"],
        )
        latency = HistogramMetricFamily(
            "regen_request_latency_seconds",
            "Seconds on the wire of successful attempts, in this run",
            labels=["lane"],
        )
        for name, lane in self._stats.lanes.items():
            in_flight.add_metric([name], lane.in_flight)
            limit.add_metric([name], lane.limit)
            configured.add_metric([name], lane.concurrency)
            for held, n in sorted(lane.waiting.items()):
                waiting.add_metric([name, held], n)
            cumulative, buckets = 0, []
            for bound, n in zip(LATENCY_BUCKETS, lane.latency_counts, strict=True):
                cumulative += n
                buckets.append((_bound(bound), cumulative))
            latency.add_metric([name], buckets, lane.latency_sum_s)
        yield from (in_flight, limit, configured, waiting, latency)

    def _endpoints(self) -> Iterator[Metric]:
        """Per endpoint of the pool, in this run: an outage is one series event (however many
        requests it failed), and its failed requests are counted where they went."""
        f = _families(_ENDPOINT_FAMILIES)
        for name, ep in sorted(self._stats.endpoints.items()):
            _add_endpoint(f, name, ep)
        yield from f.values()

    def _run(self) -> Iterator[Metric]:
        """The run as a whole: its endpoints, money (credit, held, cap), ETAs, time, build."""
        s = self._stats
        now = time.monotonic()
        yield from self._endpoints()
        yield from _money(s)
        yield from _etas(s, now)
        yield GaugeMetricFamily(
            "regen_run_elapsed_seconds", "Seconds since this run started", value=now - s.started_at
        )
        yield GaugeMetricFamily(
            "regen_run_start_time_seconds",
            "When this run started, in seconds since the Unix epoch",
            value=self._start_unix,
        )
        info = GaugeMetricFamily(
            "regen_build_info", "regen's version (always 1)", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info


_Family = GaugeMetricFamily | CounterMetricFamily
_FamilySpec = tuple[str, type[_Family], str, str, tuple[str, ...]]
"""A metric family as a table row: its key here, its type, name, help and labels."""


def _families(specs: tuple[_FamilySpec, ...]) -> dict[str, _Family]:
    """Empty families, by key, in the table's order (the order they are yielded in)."""
    return {key: kind(name, doc, labels=list(labels)) for key, kind, name, doc, labels in specs}


_DATASET_FAMILIES: tuple[_FamilySpec, ...] = (
    (
        "items",
        GaugeMetricFamily,
        "regen_items",
        "Items of a dataset by state (done, failed, pending), for the job, as regen status",
        ("dataset", "state"),
    ),
    (
        "items_in_flight",
        GaugeMetricFamily,
        "regen_items_in_flight",
        "Items of a dataset on the wire now",
        ("dataset",),
    ),
    (
        "job_answers",
        CounterMetricFamily,
        "regen_answers_total",
        "Answers (items done), for the job (survives resumes; failed items: regen_items)",
        ("dataset",),
    ),
    (
        "job_tokens",
        CounterMetricFamily,
        "regen_tokens_total",
        "Tokens used by kind (prompt, completion), for the job (survives resumes)",
        ("dataset", "kind"),
    ),
    (
        "job_cost",
        CounterMetricFamily,
        "regen_cost_usd_total",
        "Dollars (USD) spent, for the job (survives resumes)",
        ("dataset",),
    ),
    (
        "job_errors",
        CounterMetricFamily,
        "regen_attempt_errors_total",
        "Failed attempts by failure class, for the job (survives resumes)",
        ("dataset", "class"),
    ),
    (
        "run_answers",
        CounterMetricFamily,
        "regen_run_answers_total",
        "Items finished by outcome (done, failed), in this run",
        ("dataset", "outcome"),
    ),
    (
        "run_tokens",
        CounterMetricFamily,
        "regen_run_tokens_total",
        "Tokens used by kind (prompt, completion), in this run",
        ("dataset", "kind"),
    ),
    (
        "run_cost",
        CounterMetricFamily,
        "regen_run_cost_usd_total",
        "Dollars (USD) spent in this run",
        ("dataset",),
    ),
    (
        "run_errors",
        CounterMetricFamily,
        "regen_run_attempt_errors_total",
        "Failed attempts by failure class, in this run",
        ("dataset", "class"),
    ),
)


def _add_dataset(f: dict[str, _Family], name: str, d: DatasetStats) -> None:
    """One dataset's series: the job's are what state.db held at the start plus this run's."""
    b = d.before or JobTotals(done=d.done_before)
    done, failed = b.done + d.done, b.failed + d.failed
    f["items"].add_metric([name, "done"], done)
    f["items"].add_metric([name, "failed"], failed)
    f["items"].add_metric([name, "pending"], max(0, d.items - done - failed))
    f["items_in_flight"].add_metric([name], d.in_flight)
    f["job_answers"].add_metric([name], done)
    f["run_answers"].add_metric([name, "done"], d.done)
    f["run_answers"].add_metric([name, "failed"], d.failed)
    f["job_tokens"].add_metric([name, "prompt"], b.prompt_tokens + d.prompt_tokens)
    f["job_tokens"].add_metric([name, "completion"], b.completion_tokens + d.completion_tokens)
    f["run_tokens"].add_metric([name, "prompt"], d.prompt_tokens)
    f["run_tokens"].add_metric([name, "completion"], d.completion_tokens)
    f["job_cost"].add_metric([name], b.cost_usd + d.cost_usd)
    f["run_cost"].add_metric([name], d.cost_usd)
    for cls in sorted(set(b.errors) | set(d.errors)):
        f["job_errors"].add_metric([name, cls], b.errors.get(cls, 0) + d.errors[cls])
    for cls, n in sorted(d.errors.items()):
        f["run_errors"].add_metric([name, cls], n)


_ENDPOINT_FAMILIES: tuple[_FamilySpec, ...] = (
    (
        "up",
        GaugeMetricFamily,
        "regen_endpoint_up",
        "1 while an endpoint is in its pool, 0 while it is out (its server down or loading)",
        ("endpoint",),
    ),
    (
        "in_flight",
        GaugeMetricFamily,
        "regen_endpoint_requests_in_flight",
        "Requests on the wire to an endpoint now",
        ("endpoint",),
    ),
    (
        "limit",
        GaugeMetricFamily,
        "regen_endpoint_concurrency_limit",
        "An endpoint's adaptive concurrency limits now, over the lanes that use it (requests)",
        ("endpoint",),
    ),
    (
        "outages",
        CounterMetricFamily,
        "regen_run_endpoint_outages_total",
        "Times an endpoint was taken out of its pool (down or loading), in this run",
        ("endpoint",),
    ),
    (
        "resent",
        CounterMetricFamily,
        "regen_run_endpoint_resent_total",
        "Requests that failed on an endpoint out of its pool and went to another, in this run",
        ("endpoint",),
    ),
    (
        "answers",
        CounterMetricFamily,
        "regen_run_endpoint_answers_total",
        "Answers an endpoint gave, in this run",
        ("endpoint",),
    ),
    (
        "tokens",
        CounterMetricFamily,
        "regen_run_endpoint_tokens_total",
        "Tokens of an endpoint's answers by kind (prompt, completion), in this run",
        ("endpoint", "kind"),
    ),
    (
        "cost",
        CounterMetricFamily,
        "regen_run_endpoint_cost_usd_total",
        "Dollars (USD) an endpoint's answers cost, in this run",
        ("endpoint",),
    ),
    (
        "errors",
        CounterMetricFamily,
        "regen_run_endpoint_attempt_errors_total",
        "Failed attempts at an endpoint by failure class, in this run",
        ("endpoint", "class"),
    ),
)


def _add_endpoint(f: dict[str, _Family], name: str, ep: EndpointStats) -> None:
    """One endpoint's series, in this run."""
    f["up"].add_metric([name], 0 if ep.health.drained else 1)
    f["in_flight"].add_metric([name], ep.on_wire)
    f["limit"].add_metric([name], ep.limit)
    f["outages"].add_metric([name], len(ep.outages))
    f["resent"].add_metric([name], ep.resent)
    f["answers"].add_metric([name], ep.answers)
    f["tokens"].add_metric([name, "prompt"], ep.prompt_tokens)
    f["tokens"].add_metric([name, "completion"], ep.completion_tokens)
    f["cost"].add_metric([name], ep.cost_usd)
    for cls, n in sorted(ep.errors.items()):
        f["errors"].add_metric([name, cls], n)


def _money(s: RunStats) -> Iterator[Metric]:
    """The account's credit (when known), the requests held for unknown bills and what they
    may cost, and the job's dollar cap (when set)."""
    if s.credits_usd is not None:
        yield GaugeMetricFamily(
            "regen_credit_remaining_usd",
            "The account's remaining credit in dollars (USD), as last read",
            value=s.credits_usd,
        )
    held = s.holds()
    yield GaugeMetricFamily(
        "regen_held_requests",
        "Requests held for bills not known yet (a killed run's, or cut short in this run)",
        value=held.requests,
    )
    yield GaugeMetricFamily(
        "regen_held_usd",
        "The most the held requests can cost, in USD, held against the dollar caps",
        value=held.usd,
    )
    if s.max_cost_usd is not None:
        yield GaugeMetricFamily(
            "regen_cost_cap_usd",
            "The job's dollar cap in USD, [budget].max_cost_usd (compare regen_cost_usd_total)",
            value=s.max_cost_usd,
        )


def _etas(s: RunStats, now: float) -> Iterator[Metric]:
    """Seconds until the job (once it has an estimate) and each dataset are done, by quantile."""
    by_dataset, job_eta = s.etas(now)
    if job_eta is not None:
        eta = GaugeMetricFamily(
            "regen_eta_seconds",
            "Seconds until the job is done, by quantile (p10, p50, p90)",
            labels=["quantile"],
        )
        for q, v in zip(ETA_QUANTILES, (job_eta.p10, job_eta.seconds, job_eta.p90), strict=True):
            eta.add_metric([q], v)
        yield eta
    dataset_eta = GaugeMetricFamily(
        "regen_dataset_eta_seconds",
        "Seconds until a dataset is done, by quantile (p10, p50, p90)",
        labels=["dataset", "quantile"],
    )
    for name, e in by_dataset.items():
        if e is not None:
            for q, v in zip(ETA_QUANTILES, (e.p10, e.seconds, e.p90), strict=True):
                dataset_eta.add_metric([name, q], v)
    yield dataset_eta


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


def _registry(stats: RunStats) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(stats))
    return registry


def _scrape(registry: CollectorRegistry) -> bytes:
    """The one way metrics leave regen: Prometheus's text, every registered key taken out of
    it (label values, whatever a future one holds, and help texts)."""
    return redact(generate_latest(registry).decode()).encode()


def exposition(stats: RunStats) -> str:
    """What `/metrics` serves for these stats, in Prometheus's text format."""
    return _scrape(_registry(stats)).decode()


async def serve_metrics(stats: RunStats, host: str, port: int) -> web.AppRunner:
    """Start `/metrics` on host:port; the caller cleans the runner up."""
    registry = _registry(stats)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=_scrape(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
