"""How regen states a measure, once for every room: a duration as people read it, and the one
quantile rule (the budget's reservations and the report's latencies read the same p90)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

DurationStyle = Literal["compact", "prose"]

_UNITS: dict[DurationStyle, tuple[str, str, str, str]] = {
    "compact": ("s", "m", "h", "d"),
    "prose": (" s", " min", " h", " d"),
}


def format_duration(seconds: float, style: DurationStyle = "compact") -> str:
    """`42s`, `13m`, `2.4h`, `3.1d`: one unit ladder and rounding everywhere. `compact` fits a
    live table cell or a progress line; `prose` (`42 s`, `13 min`, `2.4 h`) is the report's, whose
    other figures (latencies, axis steps) are written with a spaced unit."""
    s, m, h, d = _UNITS[style]
    if seconds < 90:
        return f"{seconds:.0f}{s}"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}{m}"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}{h}"
    return f"{seconds / 86400:.1f}{d}"


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of values sorted ascending, interpolated linearly between the closest
    ranks: statistics.quantiles' `inclusive` method (numpy's default), read in O(1) from a
    sorted window so that the budget can ask at every answer. 0.0 for no values."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))
