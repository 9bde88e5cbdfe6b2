"""A run never ends with work left in silence: every pending item is listed with its reason,
and the exit code says whether the job is done (0), stopped by its cap (4) or left items for
any other reason (5)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from regen.cli import EXIT_CAP, EXIT_ITEMS_LEFT, EXIT_OK, _finish
from regen.config import load_job
from regen.run.summary import RunReport, unsent_items
from regen.sources.ingest import ingest, lane_rules
from regen.state.db import Store
from tests.conftest import write_job


def pending_job(tmp: Path, extra: str = "") -> tuple[object, Store]:
    job = load_job(write_job(tmp, "http://127.0.0.1:9/v1", rows=12))
    store = Store.open(job.output_path)
    ingest(store, job)
    store.work.assign_lanes(lane_rules(job))
    return job, store


def finish(report: RunReport) -> tuple[int, str]:
    out = io.StringIO()
    code = _finish(report, Console(file=out, width=200))
    return code, out.getvalue()


def report_for(store: Store, tmp: Path, unsent: list, **kw: object) -> RunReport:
    return RunReport(tmp, store.work.dataset_progress(), {}, {}, unsent=unsent, **kw)  # type: ignore[arg-type]


def test_items_left_without_a_known_reason_are_named_as_a_bug(tmp_path: Path) -> None:
    job, store = pending_job(tmp_path)
    unsent = unsent_items(
        job,
        store,
        stop_reason=None,
        budget_stop=False,
        unassigned={},
        blocked={},  # type: ignore[arg-type]
    )
    assert [(u.dataset, u.items, u.kind) for u in unsent] == [("chat", 12, "left")]
    assert "a bug" in unsent[0].reason
    code, text = finish(report_for(store, tmp_path, unsent))
    assert code == EXIT_ITEMS_LEFT
    assert "dataset chat: 12 items not sent: not sent for a reason regen does not know" in text
    assert "12 items were not sent (above): run the same command again" in text


def test_each_reason_has_its_exit_code(tmp_path: Path) -> None:
    job, store = pending_job(tmp_path)
    kw = {"unassigned": {"chat": 2}, "blocked": {"chat": 3}}
    interrupted = unsent_items(job, store, stop_reason="interrupted", budget_stop=False, **kw)  # type: ignore[arg-type]
    assert [(u.items, u.reason[:20]) for u in interrupted] == [
        (2, "no lane selects them"),
        (3, "they wait for an ear"),
        (7, "the run was interrupt"[:20]),
    ]
    code, _ = finish(
        report_for(store, tmp_path, interrupted, interrupted=True, stop_reason="interrupted")
    )
    assert code == EXIT_ITEMS_LEFT
    cap = "the job's dollar cap [budget].max_cost_usd = 1 is met"
    capped = unsent_items(job, store, stop_reason=cap, budget_stop=True, unassigned={}, blocked={})  # type: ignore[arg-type]
    assert [(u.items, u.kind) for u in capped] == [(12, "cap")]
    code, text = finish(report_for(store, tmp_path, capped, budget_stop=True, stop_reason=cap))
    assert code == EXIT_CAP and f"dataset chat: 12 items not sent: {cap}" in text
    assert finish(report_for(store, tmp_path, []))[0] == EXIT_OK
