"""The simulated account: credit, usage (the account's and each key's), and the generations it
was billed for."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

LimitReset = Literal["daily", "weekly", "monthly"]


def _periods(now: float) -> tuple[int, int, int]:
    """The UTC day, week (Monday to Sunday) and month that `now` falls in, as numbers."""
    day = int(now // 86400)
    t = time.gmtime(now)
    # 1970-01-01 was a Thursday: day + 3 counts from the Monday before it.
    return day, (day + 3) // 7, t.tm_year * 12 + t.tm_mon


@dataclass
class KeyUsage:
    """What one key was billed: in all, and in the current UTC day, week and month (OpenRouter
    resets a key's limit at midnight UTC, weeks running Monday to Sunday)."""

    total: float = 0.0
    periods: tuple[int, int, int] = (0, 0, 0)
    daily_usd: float = 0.0
    weekly_usd: float = 0.0
    monthly_usd: float = 0.0

    def add(self, cost_usd: float, now: float | None = None) -> None:
        self._roll(time.time() if now is None else now)
        self.total += cost_usd
        self.daily_usd += cost_usd
        self.weekly_usd += cost_usd
        self.monthly_usd += cost_usd

    def _roll(self, now: float) -> None:
        if int(now // 86400) == self.periods[0]:
            return  # the same UTC day: the same week and month
        periods = _periods(now)
        day, week, month = periods
        if day != self.periods[0]:
            self.daily_usd = 0.0
        if week != self.periods[1]:
            self.weekly_usd = 0.0
        if month != self.periods[2]:
            self.monthly_usd = 0.0
        self.periods = periods

    def usage(self, now: float | None = None) -> dict[str, float]:
        """`usage`, `usage_daily`, `usage_weekly`, `usage_monthly` as /key reports them."""
        self._roll(time.time() if now is None else now)
        return {
            "usage": self.total,
            "usage_daily": self.daily_usd,
            "usage_weekly": self.weekly_usd,
            "usage_monthly": self.monthly_usd,
        }

    def counted(self, reset: LimitReset | None, now: float | None = None) -> float:
        """The usage a limit with this reset is measured against."""
        if reset is None:
            return self.total
        return self.usage(now)[f"usage_{reset}"]


def affordable(remaining_usd: float, prompt_cost: float, completion_price: float) -> int:
    """Completion tokens `remaining_usd` pays for after the prompt."""
    if completion_price <= 0:
        return 0 if remaining_usd <= 0 else 1 << 30
    return max(0, int((remaining_usd - prompt_cost) / completion_price))


@dataclass
class Account:
    credits_usd: float | None
    used_usd: float = 0.0
    """What the whole account was billed."""
    by_key: dict[str, KeyUsage] = field(default_factory=dict)
    """What each key (the bearer string) was billed; a deleted key's record stays."""
    generations: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    @property
    def remaining_usd(self) -> float | None:
        return None if self.credits_usd is None else self.credits_usd - self.used_usd

    def affordable_tokens(self, prompt_cost: float, completion_price: float) -> int | None:
        """Completion tokens the balance covers after the prompt; None when unlimited."""
        remaining = self.remaining_usd
        if remaining is None:
            return None
        return affordable(remaining, prompt_cost, completion_price)

    def charge(self, cost_usd: float, key: str | None = None) -> None:
        """Bill the account, and the key that made the request when it is known."""
        self.used_usd += cost_usd
        if key is not None:
            self.key_usage(key).add(cost_usd)

    def key_usage(self, key: str) -> KeyUsage:
        usage = self.by_key.get(key)
        if usage is None:
            usage = self.by_key[key] = KeyUsage(periods=_periods(time.time()))
        return usage

    def usage_record(self, key: str) -> KeyUsage:
        """The key's usage record to read (a blank one, not kept, for a key never billed)."""
        usage = self.by_key.get(key)
        return usage if usage is not None else KeyUsage(periods=_periods(time.time()))

    def usage_of(self, key: str) -> float:
        """What one key (the bearer string, without `Bearer `) was billed in all."""
        usage = self.by_key.get(key)
        return usage.total if usage is not None else 0.0

    def record(self, gen_id: str, data: dict[str, Any], ends_in_s: float = 0.0) -> None:
        """Keep a generation's record; it ends `ends_in_s` (real seconds) from now."""
        self.generations[gen_id] = (time.monotonic() + ends_in_s, data)

    def generation(self, gen_id: str, delay_s: float) -> dict[str, Any] | None:
        """A generation's record, or None until `delay_s` after it ended (OpenRouter's lag;
        a generation still running is not found either)."""
        entry = self.generations.get(gen_id)
        if entry is None or time.monotonic() - entry[0] < delay_s:
            return None
        return entry[1]


def mask_key(key: str) -> str:
    """A key label as /key shows it: never the whole key."""
    return f"{key[:9]}...{key[-3:]}" if len(key) > 14 else "sk-...***"
