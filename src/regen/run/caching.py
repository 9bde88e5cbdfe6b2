"""What a provider's prompt cache is expected to save a job, for `regen plan`.

The share of a flow's prompt tokens read from cache comes from the job's structure: the
pending turns of one conversation extend each other (`each_turn`) and the samples of one
prompt repeat it, so once the longest of them is paid in full every other one is read from
cache, but for the part of a cache block at its end. What the conversations share with each
other (a long common system prompt) is what a conversation's first answer read from cache so
far (a pilot's, or an earlier run's); it applies to the part each conversation pays in full.

The dollars: the answers measured so far are priced back without the discount they got (the
endpoint's listed prices), then with the expected share at the listed cache read price and
the rest at the prompt price, or as written to the cache where the provider bills writes
(at the written share measured, else all of it at the dearer price). No listed cache read
price: no saving. Worst cases, leases and the kill margin never take a discount.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.engine.budget import Prices
from regen.state.spend import CacheUse
from regen.state.work import PromptShape

BLOCK_LOSS = 32
"""Estimated tokens of a repeated prompt's end that a cache does not serve: half of a 64-token
cache block (DeepSeek's and Moonshot's unit; a prompt is cached in whole blocks)."""


@dataclass(frozen=True, slots=True)
class FlowCache:
    """One (lane, dataset): the share of its prompt tokens to come expected from cache, and
    what its answers so far used of the cache."""

    share: float
    used: CacheUse | None = None


def structural_share(shape: PromptShape) -> float:
    """The share of the pending prompts' tokens a cache serves when each conversation's
    longest prompt is paid in full and every other one is read (but for BLOCK_LOSS)."""
    if shape.est <= 0:
        return 0.0
    read = shape.est - shape.longest - (shape.items - shape.conversations) * BLOCK_LOSS
    return max(0.0, read) / shape.est


def expected_share(shape: PromptShape | None, used: CacheUse | None) -> float:
    """The structure's share, plus what other conversations are measured to serve of the
    part each conversation pays in full."""
    inner = structural_share(shape) if shape is not None else 0.0
    across = 0.0
    if used is not None and used.first_prompt_tokens > 0:
        across = used.first_cached_tokens / used.first_prompt_tokens
    return inner + (1.0 - inner) * across


def flow_caches(
    shapes: dict[tuple[str | None, str], PromptShape],
    used: dict[tuple[str | None, str], CacheUse],
) -> dict[tuple[str, str], FlowCache]:
    """Every (lane, dataset) with pending prompts or answers, and what its cache serves."""
    keys = {k for k in (*shapes, *used) if k[0] is not None}
    return {
        (lane, ds): FlowCache(
            expected_share(shapes.get((lane, ds)), used.get((lane, ds))), used.get((lane, ds))
        )
        for lane, ds in keys
        if lane is not None
    }


def per_passage(
    cost_usd: float, prompt_tokens: float, cache: FlowCache | None, prices: Prices, prior: bool
) -> tuple[float, float]:
    """One passage's dollars (with the cache, without it), from `cost_usd` as measured (its
    own discounts in it) or as the prior priced it (every prompt token at the dearest)."""
    read, write = prices.cache_read, prices.cache_write
    if cache is None or read is None or prices.usd_per_s:
        return cost_usd, cost_usd
    full = prompt_tokens * prices.prompt
    used = cache.used
    if prior or used is None or used.prompt_tokens <= 0:
        paid = prompt_tokens * prices.prompt_worst if prior else full
        written = None
    else:
        q = used.cached_tokens / used.prompt_tokens
        v = used.cache_write_tokens / used.prompt_tokens
        paid = prompt_tokens * (
            (1 - q - v) * prices.prompt + q * read + v * (prices.prompt if write is None else write)
        )
        written = v / (1 - q) if q < 1 else 0.0
    without = cost_usd - paid + full
    fresh = prices.prompt_worst
    if written is not None:
        fresh = prices.prompt + written * (
            (prices.prompt if write is None else write) - prices.prompt
        )
    share = cache.share
    with_cache = without - full + prompt_tokens * (share * read + (1 - share) * fresh)
    return with_cache, without
