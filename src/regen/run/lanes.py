"""The run's lanes as the engine takes them: each endpoint's sender, body, prices, health
probe and the providers its routing excludes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from regen.config import EndpointConfig, GenerationConfig, Job
from regen.conversation import (
    Request,
)
from regen.engine.budget import Prices
from regen.engine.client import ChatClient, Timeouts, chat_body
from regen.engine.client.account import JsonGetter
from regen.engine.client.batch import SampleBatcher
from regen.engine.client.body import SAMPLES_KEY, sample_settings
from regen.engine.providers import excluded_names, fetch_endpoints, shared_name_warning, verdicts
from regen.engine.runtime import EndpointRuntime, LaneRuntime, Sender
from regen.errors import ConfigError

log = logging.getLogger(__name__)


def _make_body(
    job: Job, endpoint: EndpointConfig, batched: bool = False
) -> Callable[[Request, int, bool], dict[str, Any]]:
    samples = {d.name: job.dataset_samples(d) for d in job.datasets}

    def make(req: Request, max_tokens: int, stream: bool) -> dict[str, Any]:
        k = samples.get(req.dataset, 1)
        body = chat_body(req, job.generation, endpoint, max_tokens, stream=stream, samples=k)
        if batched and k > 1 and not stream:
            # For the SampleBatcher, which takes it out: how many of the prompt's samples
            # can share this request (those sent the same settings but for the seed).
            body[SAMPLES_KEY] = sharing(job.generation, req, k)
        return body

    return make


def sharing(gen: GenerationConfig, req: Request, samples: int) -> int:
    """How many of a prompt's samples are sent the same settings as this one, but for the
    seed (all of them unless a temperature, top_p or effort list tells them apart)."""
    effort = (gen.reasoning or {}).get("effort")
    if not any(isinstance(v, list) for v in (gen.temperature, gen.top_p, effort)):
        return samples
    mine = _unseeded(sample_settings(gen, req, samples))
    return sum(
        _unseeded(sample_settings(gen, replace(req, sample=k), samples)) == mine
        for k in range(samples)
    )


def _unseeded(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "seed"}


def batches_samples(job: Job, endpoint: EndpointConfig) -> bool:
    """Whether a prompt's samples go to this endpoint as one request with `n` (vLLM and
    SGLang: one prefill for all of them)."""
    return (
        endpoint.kind.samples_as_n
        and endpoint.samples_in_one_request
        and any(job.dataset_samples(d) > 1 for d in job.datasets)
    )


async def check_routes(
    job: Job, clients: Mapping[str, JsonGetter], unproven: set[str]
) -> dict[str, frozenset[str]]:
    """For each OpenRouter endpoint: the model's provider endpoints against the job's
    `provider` filters and max_tokens. Filters that leave nothing stop the run before it
    sends; the display names only excluded endpoints carry are returned (an answer that
    names one is `excluded_provider`). A catalogue that cannot be read changes nothing.
    `unproven` gets the names that an allowed and an excluded endpoint share (their answers
    cannot be proven to come from the allowed one)."""
    out: dict[str, frozenset[str]] = {}
    for e in job.endpoint_pool:
        if not e.kind.account:
            continue
        endpoints = await fetch_endpoints(clients[e.name], job.generation.model)
        if not endpoints:
            continue
        lanes = [lane for lane in job.lane_list if not lane.endpoints or e.name in lane.endpoints]
        max_tokens = min((job.lane_max_tokens(lane) for lane in lanes), default=0)
        verdict = verdicts(endpoints, e.provider, max_tokens)
        if all(v is not None for v in verdict.values()):
            why = "; ".join(f"{tag}: {reason}" for tag, reason in verdict.items())
            raise ConfigError(
                f"endpoint '{e.name}': no provider endpoint of {job.generation.model} is left "
                f"for max_tokens {max_tokens} ({why}); every request would fail with 404. "
                f"See `regen providers {job.generation.model} --job JOB.toml`"
            )
        only_excluded, mixed = excluded_names(endpoints, verdict)
        if mixed:
            advice = shared_name_warning(endpoints, e.provider, verdict)
            log.info(
                f"note: endpoint '{e.name}': {', '.join(sorted(mixed))} also serve(s) from an "
                "excluded endpoint; an answer names only its provider, so those answers cannot "
                "be proven to come from an allowed endpoint (routing honours the filters)"
                + (f". {advice}" if advice else "")
            )
            unproven.update(mixed)
        out[e.name] = frozenset(only_excluded)
    return out


def _batching(sender: Sender) -> Sender:
    return SampleBatcher(sender) if isinstance(sender, ChatClient) else sender


def build_lanes(
    job: Job,
    senders: Mapping[str, Sender],
    prices: Mapping[str, Prices | None] | None = None,
    excluded: Mapping[str, frozenset[str]] | None = None,
) -> list[LaneRuntime]:
    """The job's lanes, each with its endpoints (by name in `senders`) and settings."""
    prices = prices or {}
    excluded = excluded or {}
    runtimes = {
        e.name: EndpointRuntime(
            e.name,
            _batching(senders[e.name]) if batches_samples(job, e) else senders[e.name],
            _make_body(job, e, batched=batches_samples(job, e)),
            e.weight,
            prices=prices.get(e.name),
            generation_records=e.kind.account,
            job_key=e.management_key_env is not None,
            billed_after_gone=not e.kind.self_hosted,
            excluded_providers=excluded.get(e.name, frozenset()),
            health_url=e.kind.health_url(e.base_url),
        )
        for e in job.endpoint_pool
    }
    order = [d.name for d in job.datasets]
    return [
        LaneRuntime(
            name=lane.name,
            concurrency=lane.concurrency,
            max_tokens=job.lane_max_tokens(lane),
            timeouts=Timeouts(
                total_s=job.lane_timeout_s(lane),
                connect_s=job.run.connect_timeout_s,
                ttfb_s=job.run.ttfb_timeout_s,
                idle_s=job.run.idle_timeout_s,
                read_interval_s=job.run.stream_read_interval_s,
            ),
            endpoints=[runtimes[n] for n in lane.endpoints or list(runtimes)],
            datasets=[d for d in order if lane.datasets is None or d in lane.datasets],
            stream=lane.stream,
            escalate_to=lane.escalate_to,
        )
        for lane in job.lane_list
    ]


def lane_settings(job: Job) -> dict[str, dict[str, Any]]:
    """What the report needs to know of each lane, as this run had it."""
    return {
        lane.name: {
            "max_tokens": job.lane_max_tokens(lane),
            "concurrency": lane.concurrency,
            "escalate_to": lane.escalate_to,
        }
        for lane in job.lane_list
    }
