"""`<out>/report.html`: what a job did, as one self-contained page.

First the job over time, run by run (answers and tokens per second, reasoning and content
apart, requests in flight against each lane's adaptive limit, dollars spent against the cap,
failed attempts by class and as a share of the attempts, 429s), then the lanes and their
escalations, then per endpoint: answers, tokens, cost, latency and throughput, then per
dataset: the tokens of its answers, throughput, the completion-length histogram marked at
each lane's max_tokens, latency percentiles, cost, errors by class and the providers that
served. All read from state.db (read-only). Charts are inline SVG: the page needs no script
and no network, so it opens anywhere, offline.

Time axes leave out the time between runs (a marked break), so an idle night does not read
as a night of zero throughput. Rates are counted over steps of a minute or more, so a lone
event reads as one a minute. Every series is bucketed in one pass over the rows, so a chart
is a few hundred path points whatever the number of answers.

Modules, each importing only those before it: `data` (state.db into dataclasses),
`axes` (ticks and the broken time axis), `markup` and `svg` (HTML pieces and charts),
`job_charts`, `job`, `endpoints` and `dataset` (the sections), `page` (the whole page,
written atomically).
"""

from __future__ import annotations

from regen.outputs.report.axes import Span, TimeAxis, activity_spans, nice_step, nice_ticks
from regen.outputs.report.data import (
    DatasetReport,
    EndpointReport,
    JobFacts,
    Report,
    gather,
    run_labels,
    run_windows,
)
from regen.outputs.report.page import render, write_report

__all__ = [
    "DatasetReport",
    "EndpointReport",
    "JobFacts",
    "Report",
    "Span",
    "TimeAxis",
    "activity_spans",
    "gather",
    "nice_step",
    "nice_ticks",
    "render",
    "run_labels",
    "run_windows",
    "write_report",
]
