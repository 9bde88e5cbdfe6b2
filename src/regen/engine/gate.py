"""The gate: every number from outside that moves money passes here before regen counts it.

Prices from a catalogue, bills and token counts from an answer or from `/generation`, an
account's usage and credit: a provider, or a proxy in front of it, may send any of them wrong
(negative, zero, NaN, 1e18, a string). Believed, one such number switched a dollar cap off (a
price of -1), freed cap room (a bill of -5) or blocked a job for good (1e18 tokens). So a
number counts only when it is an amount (a finite number of 0 or more) and plausible against
what was asked:

- a price at most MAX_USD_PER_TOKEN, and above 0 for a paid model (one not `:free`);
- completion tokens at most max_tokens, plus COMPLETION_SLACK (each choice of an `n` request
  is judged as its own answer, with its share of the bill);
- prompt tokens at most the prompt's tokenizer-free bound, plus PROMPT_SLACK
  (MAX_PROMPT_TOKENS where the prompt is not known: a held request's bill);
- cached (read) and written prompt tokens together at most the prompt tokens;
- a bill at most BILL_CEILING x the request's worst case at the highest price known for the
  model, and at least BILL_FLOOR x what its completion tokens cost at the lowest price listed
  (a bill of 0 for an answer that wrote tokens is no bill).

What fails is never counted as given and never frees room: an answer is kept, flagged
(`usage_source = 'worst'`) and charged its worst case; a held request's bill likewise, at once
(a junk record never makes a run wait for the request's deadline); a price is left out of the
worst cases' basis; an account's usage or credit is taken as unknown. Each field is said
once, the first time, in a line naming the provider that sent it; the end of the run counts
them per field and provider.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from regen.conversation import Usage
from regen.safe import printable

MAX_USD_PER_TOKEN = 0.01
"""$10,000 per million tokens: more than ten times the dearest price OpenRouter has listed
(o1-pro's $600 per million completion tokens). A price above it is no price (a proxy that
writes 1e18 would otherwise make every request's worst case exceed any cap)."""
COMPLETION_SLACK = (0.05, 16)
"""Completion tokens a provider may count beyond max_tokens: 5% and 16 tokens (a
stop token, a tokenizer that counts differently from the one that enforced the limit)."""
PROMPT_SLACK = (2.0, 4096)
"""Prompt tokens a provider may count beyond the bound regen computes for a prompt (its UTF-8
bytes, the tools' JSON, room for the template), which is one already: twice it, and 4,096
tokens for a system prompt of the provider's own (some add tool-use instructions)."""
MAX_PROMPT_TOKENS = 10_000_000
"""Prompt tokens where the prompt is not known (a held request's bill): no model's context
holds more."""
BILL_CEILING = 16.0
"""A bill at most this many times the request's worst case at the highest known price (and
prices learned from bills rise at most this many times): prices that changed under a run, or
prices in the job file below the provider's, stay inside it."""
BILL_FLOOR = 0.1
"""A bill of less than a tenth of what its completion tokens cost at the lowest listed
completion price is not a bill for them (discounts such as cache reads apply to prompts)."""

WORST = "worst"
"""`Usage.source` of an answer whose usage was not believed: charged its worst case."""


def amount(value: Any) -> float | None:
    """`value` as an amount: a finite int or float of 0 or more (never a bool or a string);
    None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) and number >= 0 else None


def shown(value: Any) -> str:
    """A value as a line shows it: short, and quoted when it is text."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def listed_price(value: Any) -> float | None:
    """A catalogue price (OpenRouter writes them as strings of USD per token), or None when
    it is not one: not a number, not finite, negative, or above MAX_USD_PER_TOKEN."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    price = amount(value)
    return price if price is not None and price <= MAX_USD_PER_TOKEN else None


def free_model(model: str) -> bool:
    """OpenRouter's free variants end in `:free`: a price of 0 is theirs."""
    return model.endswith(":free")


@dataclass(frozen=True, slots=True)
class Listing:
    """What a model's catalogue says its endpoints charge, as the gate lets it through: the
    highest valid prompt and completion prices (the worst cases' basis), the lowest valid
    completion price (a bill's floor), and what it refused, one line each."""

    high: tuple[float, float] | None
    low_completion: float | None
    refused: tuple[tuple[str, str], ...] = ()
    """(endpoint, what it listed) for each endpoint left out."""
    cache_read: float | None = None
    """The highest cache read price of the endpoints that cache (None: none lists one): what a
    cached token costs whichever of them served it."""
    cache_write: float | None = None
    """The highest cache write price listed (None: none lists one; writes cost the prompt's)."""
    cache_refused: tuple[tuple[str, str], ...] = ()
    """(endpoint, what it listed) for each cache price not believed."""


def cache_prices(
    prompt: float, raw_read: Any, raw_write: Any
) -> tuple[float | None, float | None, list[str]]:
    """An endpoint's cache read and write prices (None: not listed), and what was not believed:
    a price that is no price, or a read above the prompt price (a cache read is a discount).
    A read not believed is taken at the prompt price, a write at none (the prompt's)."""
    read = write = None
    bad = []
    if raw_read is not None:
        read = listed_price(raw_read)
        if read is None or read > prompt:
            why = "" if read is None else f" (above the prompt price {prompt:g})"
            bad.append(f"pricing.input_cache_read = {shown(raw_read)}{why}")
            read = prompt
    if raw_write is not None:
        write = listed_price(raw_write)
        if write is None:
            bad.append(f"pricing.input_cache_write = {shown(raw_write)}")
    return read, write, bad


def listing(model: str, endpoints: Iterable[tuple[Any, ...]]) -> Listing:
    """Judge a catalogue's (endpoint, prompt price, completion price[, cache read price, cache
    write price]) entries. An endpoint is left out when either of its first prices is not a
    price, or, for a paid model, when its completion price is 0 (an endpoint that bills
    nothing for answers is no basis for a worst case); its cache prices are judged by
    `cache_prices`."""
    good: list[tuple[float, float]] = []
    refused: list[tuple[str, str]] = []
    reads: list[float] = []
    writes: list[float] = []
    cache_refused: list[tuple[str, str]] = []
    for name, raw_prompt, raw_completion, *cache in endpoints:
        prompt, completion = listed_price(raw_prompt), listed_price(raw_completion)
        bad = [
            f"pricing.{key} = {shown(raw)}"
            for key, raw, price in (
                ("prompt", raw_prompt, prompt),
                ("completion", raw_completion, completion),
            )
            if price is None
        ]
        if not bad and completion == 0 and not free_model(model):
            bad = [f"pricing.completion = {shown(raw_completion)} for a paid model"]
        if bad:
            refused.append((name, ", ".join(bad)))
            continue
        assert prompt is not None and completion is not None
        good.append((prompt, completion))
        read, write, doubted = cache_prices(prompt, *(cache + [None, None])[:2])
        reads += [] if read is None else [read]
        writes += [] if write is None else [write]
        cache_refused += [(name, what) for what in doubted]
    if not good:
        return Listing(None, None, tuple(refused))
    high = (max(p for p, _ in good), max(c for _, c in good))
    positive = [c for _, c in good if c > 0]
    return Listing(
        high,
        min(positive) if positive else None,
        tuple(refused),
        max(reads, default=None),
        max(writes, default=None),
        tuple(cache_refused),
    )


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asked for, which its bill must be plausible against."""

    max_tokens: int
    prompt_bound: int | None = None
    """Its prompt's tokenizer-free bound (None: not known, as for a held request, or not
    needed: a prompt count within PROMPT_SLACK's tokens passes whatever the bound)."""
    worst_usd: float | None = None
    """Its worst case at the highest price known for the model (None: no price known)."""
    floor_usd_per_token: float | None = None
    """The lowest completion price listed for the model (None: none known)."""

    @property
    def most_completion(self) -> int:
        share, tokens = COMPLETION_SLACK
        return math.ceil(self.max_tokens * (1 + share)) + tokens

    @property
    def most_prompt(self) -> int:
        if self.prompt_bound is None:
            return MAX_PROMPT_TOKENS
        share, tokens = PROMPT_SLACK
        return math.ceil(self.prompt_bound * share) + tokens


def doubts(usage: Usage, asked: Asked, where: str) -> list[str]:
    """Why `usage` (from `where`: `usage` of an answer, `/generation` of a held request) is
    not believed: its fields that were not amounts (the parser's `junk`), and those beyond
    what was asked. Empty when it is believed."""
    out = [f"{where}.{j}" for j in usage.junk]
    if usage.completion_tokens > asked.most_completion:
        out.append(
            f"{where}.completion_tokens = {usage.completion_tokens} (max_tokens "
            f"{asked.max_tokens} allows {asked.most_completion})"
        )
    if usage.prompt_tokens > asked.most_prompt:
        out.append(
            f"{where}.prompt_tokens = {usage.prompt_tokens} (the prompt allows {asked.most_prompt})"
        )
    reused = usage.cached_tokens + usage.cache_write_tokens
    if reused > usage.prompt_tokens:
        out.append(
            f"{where}.cached_tokens + cache_write_tokens = {reused} (more than its "
            f"{usage.prompt_tokens} prompt tokens)"
        )
    cost = usage.cost_usd
    if cost is not None and asked.worst_usd is not None:
        most = asked.worst_usd * BILL_CEILING
        if cost > most:
            out.append(
                f"{where}.cost = {cost:g} (above {BILL_CEILING:g}x the request's worst case: "
                f"${most:.6f})"
            )
    if cost is not None and asked.floor_usd_per_token and not out:
        least = BILL_FLOOR * usage.completion_tokens * asked.floor_usd_per_token
        if cost < least:
            out.append(
                f"{where}.cost = {cost:g} for {usage.completion_tokens} completion tokens "
                f"(below {BILL_FLOOR:g}x their lowest listed price, ${least:.8f})"
            )
    return out


def worst_usage(asked: Asked, usage: Usage) -> Usage:
    """The charge of an answer or bill not believed: max_tokens, the prompt's bound
    (or what was billed, when lower and believable), and the worst case in dollars."""
    if asked.prompt_bound is not None:
        prompt = asked.prompt_bound
    else:  # a held request's: what its record says, when that is believable
        prompt = usage.prompt_tokens if usage.prompt_tokens <= asked.most_prompt else 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=asked.max_tokens,
        reasoning_tokens=0,
        cost_usd=asked.worst_usd,
        source=WORST,
    )


@dataclass
class Gate:
    """One run's gate: it judges what providers say (`usage`, `credit`, `prices`) and keeps
    what it refused, to be said once per field (`take_lines`: the first time, naming the
    provider) and counted at the end (`end_lines`: per field, by provider)."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    """Refusals by field (`/generation record.total_cost`), then by who sent them."""
    worst_usd: float = 0.0
    """Charged at worst cases in place of bills not believed."""
    _new: list[str] = field(default_factory=list)

    def refuse(self, channel: str, who: str, what: str, then: str) -> None:
        """Count a refusal of `what` (a field and its value) that `who` sent on `channel`
        (`/generation`, an answer's usage, `/key`, a catalogue); the first for its field is
        said, with what regen does instead (`then`)."""
        key = f"{channel} {what.split(' ', 1)[0]}"
        seen = self.counts.setdefault(key, Counter())
        if not seen:
            self._new.append(
                printable(
                    f"gate: {who} sent {what} in {channel}, which regen does not believe: "
                    f"{then} (said once for this field; the run's end counts them)"
                )
            )
        seen[who] += 1

    def say(self, line: str) -> None:
        """A line for the same once-said channel (what the client learned of a server)."""
        self._new.append(printable(line))

    def take_lines(self) -> list[str]:
        """The lines not yet shown."""
        lines, self._new = self._new, []
        return lines

    def usage(
        self, usage: Usage, asked: Asked, *, channel: str, who: str, where: str = "usage"
    ) -> Usage:
        """`usage` when it is believed, else the worst case (`worst_usage`), said."""
        found = doubts(usage, asked, where)
        if not found:
            return usage
        charged = worst_usage(asked, usage)
        cost = "" if charged.cost_usd is None else f" (${charged.cost_usd:.6f})"
        then = (
            f"the answer is kept, flagged, and charged its worst case{cost}"
            if where == "usage"
            else f"the request is charged its worst case{cost} now"
        )
        for what in found:
            self.refuse(channel, who, what, then)
        self.worst_usd += charged.cost_usd or 0.0
        return charged

    def credit(self, value: Any, *, channel: str, what: str) -> float | None:
        """An account's usage or credit when it is an amount; None (unknown) otherwise."""
        number = amount(value)
        if number is None and value is not None:
            self.refuse(channel, "the account", f"{what} = {shown(value)}", "taken as unknown")
        return number

    def prices(self, model: str, found: Listing, *, channel: str) -> None:
        """Say what a catalogue listing left out of the prices' basis."""
        then = (
            "left out of the worst cases (the highest of the other endpoints' prices is used)"
            if found.high is not None
            else "no endpoint of the model lists a price regen can use"
        )
        for who, what in found.refused:
            self.refuse(channel, f"{who} ({model})", what, then)
        for who, what in found.cache_refused:
            self.refuse(
                channel,
                f"{who} ({model})",
                what,
                "taken at its prompt price (no discount that is not believed)",
            )

    def end_lines(self) -> list[str]:
        """One line per field refused, with how often and from whom."""
        lines = []
        for key, by in sorted(self.counts.items()):
            whom = ", ".join(f"{who} {n}" for who, n in by.most_common())
            total = sum(by.values())
            lines.append(printable(f"gate: {key} not believed {total} time(s) ({whom})"))
        if self.worst_usd > 0:
            lines.append(
                f"gate: ${self.worst_usd:.4f} charged at worst cases in place of bills not "
                "believed (the caps count it; the provider's own bill may be lower)"
            )
        return lines


def believed(usage: Usage) -> bool:
    """Whether an answer's usage was believed (not charged at its worst case)."""
    return usage.source != WORST
