"""What `regen providers` shows: a model's provider endpoints on OpenRouter, with their
prices and limits, and which ones the job's filters exclude."""

from __future__ import annotations

from rich.table import Table

from regen.engine.providers import EndpointInfo

PROVIDER_COLUMNS = ("provider", "tag", "quant", "$/Mtok in", "$/Mtok out", "context", "max out")


def dash_or(v: float | int | None, fmt: str) -> str:
    """A number in `fmt`, or "-" when the catalogue does not say."""
    return "-" if v is None else format(v, fmt)


def providers_table(
    model: str, eps: list[EndpointInfo], verdict: dict[str, str | None], *, job: bool
) -> Table:
    """One row per endpoint: its prices and limits, and whether the job (if one was given)
    uses it."""
    table = Table(title=f"{model}: {len(eps)} endpoints", title_justify="left")
    for col in (*PROVIDER_COLUMNS, "uptime %", "tok/s p50", "job"):
        table.add_column(
            col, justify="left" if col in ("provider", "tag", "quant", "job") else "right"
        )
    for e in eps:
        reason = verdict[e.tag]
        table.add_row(
            e.provider_name,
            e.tag,
            e.quantization or "-",
            dash_or(e.prompt_usd_per_mtok, ".3f"),
            dash_or(e.completion_usd_per_mtok, ".3f"),
            dash_or(e.context_length, ","),
            dash_or(e.max_completion_tokens, ","),
            dash_or(e.uptime, ".1f"),
            dash_or(e.throughput_p50, ".0f"),
            ("excluded: " + reason) if reason else ("used" if job else ""),
            style="dim" if reason else None,
        )
    return table
