"""Inline SVG charts: a canvas with gridlines and axis titles, step lines on a time axis
with the gaps between runs and each run's start marked, and rates and shares per bucket. No
script and no external asset, so the page opens anywhere, offline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from regen.measures import format_duration
from regen.outputs.report.axes import TimeAxis, fmt_tick, nice_ticks, utc
from regen.outputs.report.data import JobFacts
from regen.outputs.report.markup import html_esc
from regen.state.runs import RunRecord

PALETTE = ("#2a7", "#27c", "#d62", "#a3c", "#c90", "#3aa", "#c36", "#777", "#68a", "#9a3")

Series = tuple[Sequence[float | None], str, str]
"""A line on a time chart: a value per bucket (None: no line there), colour, dash pattern."""


def coord(v: float) -> str:
    return f"{v:.1f}"


@dataclass(frozen=True, slots=True)
class Plot:
    """An SVG canvas with margins for tick labels and axis titles; ymax is the axis top."""

    width: int
    height: int
    ymax: float = 1.0
    left: int = 64
    right: int = 16
    top: int = 30
    bottom: int = 40

    @property
    def pw(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def ph(self) -> float:
        return float(self.height - self.top - self.bottom)

    def y(self, v: float) -> float:
        return self.top + self.ph - min(v, self.ymax) / self.ymax * self.ph

    def xa(self, x: float) -> float:
        """A plot-area x (0 at the y axis) on the canvas."""
        return self.left + x


def chart_frame(
    plot: Plot,
    yticks: list[float],
    y_title: str,
    x_ticks: list[tuple[float, str]],
    x_title: str,
    body: list[str],
    name: str,
    prefix: str = "",
) -> str:
    """Gridlines, tick labels and axis titles around `body` (drawn in canvas coordinates)."""
    step = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    parts = [
        f'<svg class="chart" data-chart="{html_esc(name)}" '
        f'viewBox="0 0 {plot.width} {plot.height}" '
        f'width="{plot.width}" height="{plot.height}" role="img" '
        f'aria-label="{html_esc(name)}">'
    ]
    x_end = plot.left + plot.pw
    for v in yticks:
        y = coord(plot.y(v))
        parts.append(f'<line class="grid" x1="{plot.left}" x2="{coord(x_end)}" y1="{y}" y2="{y}"/>')
        parts.append(
            f'<text class="tick y" x="{plot.left - 6}" y="{y}" dy="4" text-anchor="end">'
            f"{html_esc(fmt_tick(v, step, prefix))}</text>"
        )
    base = coord(plot.top + plot.ph)
    for x, label in x_ticks:
        xs = coord(plot.xa(x))
        # A label at an end of the axis is kept inside the canvas (about 6.5 px a character).
        half = 3.3 * len(label)
        anchor = "end" if x + half > plot.pw + plot.right else "middle"
        anchor = "start" if x - half < -plot.left else anchor
        parts.append(
            f'<line class="grid" x1="{xs}" x2="{xs}" y1="{plot.top}" y2="{base}"/>'
            f'<text class="tick x" x="{xs}" y="{coord(plot.top + plot.ph + 15)}" '
            f'text-anchor="{anchor}">{html_esc(label)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{plot.left}" x2="{coord(x_end)}" y1="{base}" y2="{base}"/>'
        f'<line class="axis" x1="{plot.left}" x2="{plot.left}" y1="{plot.top}" y2="{base}"/>'
    )
    parts.extend(body)
    mid_y = coord(plot.top + plot.ph / 2)
    parts.append(
        f'<text class="title y" transform="translate(14 {mid_y}) rotate(-90)" '
        f'text-anchor="middle">{html_esc(y_title)}</text>'
        f'<text class="title x" x="{coord(plot.left + plot.pw / 2)}" y="{plot.height - 6}" '
        f'text-anchor="middle">{html_esc(x_title)}</text></svg>'
    )
    return "".join(parts)


def _steps(
    axis: TimeAxis,
    plot: Plot,
    values: Sequence[float | None],
    color: str,
    dash: str = "",
    cls: str = "series",
) -> str:
    """A step line over the buckets; None (no data) and the gaps between spans break it."""
    d: list[str] = []
    prev_span, open_ = -1, False
    for b, v in zip(axis.buckets(), values, strict=True):
        if v is None:
            open_ = False
            continue
        y = coord(plot.y(v))
        if not open_ or b.span != prev_span:
            d.append(f"M{coord(plot.xa(b.x0))},{y}")
        else:
            d.append(f"V{y}")
        d.append(f"H{coord(plot.xa(b.x1))}")
        prev_span, open_ = b.span, True
    if not d:
        return ""
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<path class="{cls}" d="{"".join(d)}" fill="none" stroke="{color}" '
        f'stroke-width="1.6"{dash_attr}/>'
    )


def _time_marks(axis: TimeAxis, plot: Plot, runs: list[RunRecord], labels: list[str]) -> list[str]:
    """The breaks between spans (shaded, with a double slash on the axis) and a labelled
    line at each run's start."""
    out: list[str] = []
    top, base = plot.top, plot.top + plot.ph
    for x0, x1, secs in axis.gaps():
        a, b = plot.xa(x0), plot.xa(x1)
        out.append(
            f'<g class="gap"><title>{html_esc(format_duration(secs, "prose"))} between runs, '
            "left out</title>"
            f'<rect x="{coord(a)}" y="{top}" width="{coord(b - a)}" height="{coord(plot.ph)}"/>'
            f'<path d="M{coord(a + 2)},{coord(base + 5)}l4,-10'
            f'M{coord(a + 7)},{coord(base + 5)}l4,-10"/></g>'
        )
    for k, (run, label) in enumerate(zip(runs, labels, strict=True)):
        x = coord(plot.xa(axis.x(run.started_at)))
        y = 11 if k % 2 == 0 else 23
        out.append(
            f'<line class="run-start" data-run="{html_esc(label)}" x1="{x}" x2="{x}" y1="{y + 3}" '
            f'y2="{coord(base)}"><title>{html_esc(label)} started {utc(run.started_at)} UTC</title>'
            f'</line><text class="run-label" x="{x}" dx="3" y="{y}">{html_esc(label)}</text>'
        )
    return out


def time_chart(
    name: str,
    axis: TimeAxis,
    job: JobFacts,
    labels: list[str],
    series: Sequence[Series],
    y_title: str,
    width: int,
    height: int = 230,
    extra_top: float = 0.0,
    extra: Callable[[Plot], list[str]] | None = None,
    prefix: str = "",
) -> str:
    """Series (values per bucket, colour, dash) on the time axis, with run marks."""
    top = max([extra_top] + [v for s, _, _ in series for v in s if v is not None])
    yticks = nice_ticks(top * 1.04 if top > 0 else 1.0)
    plot = Plot(width, height, ymax=yticks[-1])
    body = _time_marks(axis, plot, job.runs, labels)
    body.extend(_steps(axis, plot, v, color, dash) for v, color, dash in series)
    if extra is not None:
        body.extend(extra(plot))
    return chart_frame(plot, yticks, y_title, axis.ticks(), axis.title(), body, name, prefix)


def rate_series(counts: list[float], axis: TimeAxis, per_s: float) -> list[float | None]:
    """Counts per bucket as a rate: a count over a bucket of w seconds is count / w a second,
    times `per_s` (60: a minute). Meant for an axis whose steps are at least the unit's
    (RATE_STEP_S), so one event reads as one a minute, not as a spike of 60."""
    return [c / b.seconds * per_s for c, b in zip(counts, axis.buckets(), strict=True)]


def share_series(part: list[float], whole: list[float]) -> list[float | None]:
    """`part` as a percentage of `whole`, per bucket; None (no line) where `whole` is 0."""
    return [p / w * 100.0 if w else None for p, w in zip(part, whole, strict=True)]
