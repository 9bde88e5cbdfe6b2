"""Prometheus metrics of a running job (`regen run --metrics-port N`).

Nothing is counted twice: a collector reads the run's live counters (`RunStats`) when it is
scraped, so the request path pays nothing for metrics but one bucket increment per answer.
The endpoint listens on 127.0.0.1 unless `[run] metrics_host` says otherwise.
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

from regen.scheduler import LATENCY_BUCKETS, RunStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RunCollector(Collector):
    """The run's counters as metric families, read at scrape time."""

    def __init__(self, stats: RunStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        items = GaugeMetricFamily(
            "regen_items", "Items of a dataset, by state", labels=["dataset", "state"]
        )
        answers = CounterMetricFamily(
            "regen_requests",
            "Items finished in this run, by outcome",
            labels=["dataset", "outcome"],
        )
        errors = CounterMetricFamily(
            "regen_attempt_errors",
            "Failed attempts in this run, by failure class",
            labels=["dataset", "class"],
        )
        tokens = CounterMetricFamily(
            "regen_tokens", "Tokens used in this run", labels=["dataset", "kind"]
        )
        cost = CounterMetricFamily(
            "regen_cost_usd", "Dollars spent in this run", labels=["dataset"]
        )
        for name, d in s.datasets.items():
            items.add_metric([name, "total"], d.items)
            items.add_metric([name, "done"], d.done_before + d.done)
            items.add_metric([name, "in_flight"], d.in_flight)
            answers.add_metric([name, "done"], d.done)
            answers.add_metric([name, "failed"], d.failed)
            for cls, n in sorted(d.errors.items()):
                errors.add_metric([name, cls], n)
            tokens.add_metric([name, "prompt"], d.prompt_tokens)
            tokens.add_metric([name, "completion"], d.completion_tokens)
            cost.add_metric([name], d.cost_usd)
        yield from (items, answers, errors, tokens, cost)

        in_flight = GaugeMetricFamily("regen_in_flight", "Requests on the wire", labels=["lane"])
        limit = GaugeMetricFamily(
            "regen_concurrency_limit", "The adaptive concurrency limit now", labels=["lane"]
        )
        ceiling = GaugeMetricFamily(
            "regen_concurrency_max", "The lane's configured concurrency", labels=["lane"]
        )
        latency = HistogramMetricFamily(
            "regen_request_latency_seconds",
            "Time on the wire of successful attempts",
            labels=["lane"],
        )
        for name, lane in s.lanes.items():
            in_flight.add_metric([name], lane.in_flight)
            limit.add_metric([name], lane.limit)
            ceiling.add_metric([name], lane.concurrency)
            cumulative, buckets = 0, []
            for bound, n in zip(LATENCY_BUCKETS, lane.latency_counts, strict=True):
                cumulative += n
                buckets.append((_bound(bound), cumulative))
            latency.add_metric([name], buckets, lane.latency_sum_s)
        yield from (in_flight, limit, ceiling, latency)

        if s.credits_usd is not None:
            yield GaugeMetricFamily(
                "regen_credit_remaining_usd", "The account's remaining credit", value=s.credits_usd
            )
        _, job_eta = s.etas(time.monotonic())
        if job_eta is not None:
            eta = GaugeMetricFamily(
                "regen_eta_seconds", "Seconds until the job is done", labels=["quantile"]
            )
            for q, v in (("0.1", job_eta.p10), ("0.5", job_eta.seconds), ("0.9", job_eta.p90)):
                eta.add_metric([q], v)
            yield eta
        yield GaugeMetricFamily(
            "regen_elapsed_seconds",
            "Seconds since the run started",
            value=time.monotonic() - s.started_at,
        )


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


async def serve_metrics(stats: RunStats, host: str, port: int) -> web.AppRunner:
    """Start `/metrics` on host:port; the caller cleans the runner up."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(stats))

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
