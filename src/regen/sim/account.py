"""The simulated account: credit, usage, and the generations it was billed for."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Account:
    credits_usd: float | None
    used_usd: float = 0.0
    generations: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    @property
    def remaining_usd(self) -> float | None:
        return None if self.credits_usd is None else self.credits_usd - self.used_usd

    def affordable_tokens(self, prompt_cost: float, completion_price: float) -> int | None:
        """Completion tokens the balance covers after the prompt; None when unlimited."""
        remaining = self.remaining_usd
        if remaining is None:
            return None
        if completion_price <= 0:
            return 0 if remaining <= 0 else 1 << 30
        return max(0, int((remaining - prompt_cost) / completion_price))

    def charge(self, cost_usd: float) -> None:
        self.used_usd += cost_usd

    def record(self, gen_id: str, data: dict[str, Any]) -> None:
        self.generations[gen_id] = (time.monotonic(), data)

    def generation(self, gen_id: str, delay_s: float) -> dict[str, Any] | None:
        """A generation's record, or None while it is not visible yet (OpenRouter's lag)."""
        entry = self.generations.get(gen_id)
        if entry is None or time.monotonic() - entry[0] < delay_s:
            return None
        return entry[1]


def mask_key(key: str) -> str:
    """A key label as /key shows it: never the whole key."""
    return f"{key[:9]}...{key[-3:]}" if len(key) > 14 else "sk-...***"
