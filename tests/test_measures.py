"""The shared measures: one duration format for every room, one quantile rule for the budget
and the report."""

from __future__ import annotations

from statistics import quantiles

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regen.measures import format_duration, quantile


@pytest.mark.parametrize(
    ("seconds", "compact", "prose"),
    [
        (4.2, "4s", "4 s"),
        (89, "89s", "89 s"),
        (90, "2m", "2 min"),
        (13 * 60, "13m", "13 min"),
        (90 * 60, "1.5h", "1.5 h"),
        (47 * 3600, "47.0h", "47.0 h"),
        (3.1 * 86400, "3.1d", "3.1 d"),
    ],
)
def test_a_duration_reads_the_same_in_both_styles_but_for_the_units(
    seconds: float, compact: str, prose: str
) -> None:
    assert format_duration(seconds) == compact
    assert format_duration(seconds, "prose") == prose


def test_the_live_line_and_the_report_share_one_formatter() -> None:
    """No room keeps a formatter of its own: the ETA's and the report's are this one."""
    from regen.engine import eta
    from regen.outputs.report import axes, job, svg

    assert eta.format_duration is format_duration
    assert job.format_duration is format_duration and svg.format_duration is format_duration
    assert not hasattr(axes, "fmt_duration")


@given(
    st.lists(st.integers(0, 10**6) | st.floats(0, 1e6), min_size=2, max_size=60),
    st.integers(1, 99),
)
def test_the_quantile_is_the_stdlibs_inclusive_one(values: list[float], pct: int) -> None:
    expected = quantiles(values, n=100, method="inclusive")[pct - 1]
    assert quantile(sorted(values), pct / 100) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_the_quantile_of_nothing_is_zero_and_of_one_value_that_value() -> None:
    assert quantile([], 0.9) == 0.0
    assert quantile([7], 0.9) == 7.0
