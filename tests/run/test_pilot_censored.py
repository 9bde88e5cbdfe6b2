"""A pilot's answers cut off still running: recorded with how long they had run, counted by
the plan as times known only as lower bounds, and said per lane in the pilot's last lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from regen.run.forecast import censored_factor, censored_stat, plan
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import chat_rows, query, run_cli, write_job, write_rows
from tests.run.test_plan import PRICES, offline_job, passage, progress


def test_a_pilot_cut_off_by_its_time_counts_the_answers_still_running(tmp_path: Path) -> None:
    """Answers past the first 10 never come (held by the simulator): at the pilot's time bound
    they are cut off. Each is kept with the time it ran (sending stops at 3.6 s, the grace
    ends at 4 s), the pilot's last lines say how many of the lane's times are censored and the
    least its time per answer can be, and the plan's time is no shorter than that makes it
    (from the 10 answers alone, each a few milliseconds, it said 3 s for 590 items)."""
    for name in ("a", "b"):
        write_rows(tmp_path / f"{name}.jsonl", chat_rows(300))
    datasets = [("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")]
    with sim_in_thread(SimConfig(seed=5, time_scale=0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=datasets, concurrency=8)
        sim.simulator.hold(after=10)
        try:
            out = run_cli(
                "plan",
                str(job),
                "--pilot",
                "300",
                "--precision",
                "0.05",
                "--pilot-time",
                "4",
                "--json",
                process=True,
                timeout=60,
            )
        finally:
            sim.simulator.release()
    assert out.returncode == 0, out.stderr
    cut = query(
        tmp_path / "out",
        "SELECT c.lane, c.elapsed_s, i.status FROM cut_short c JOIN items i ON i.id = c.item_id",
    )
    # The 8 slots filled with held requests at once; nothing came back to free them.
    assert len(cut) == 8, cut
    assert all(lane == "default" and status == "pending" for lane, _, status in cut), cut
    # A second of slack each way for a loaded machine (as the time-bound test allows).
    assert all(2.0 < elapsed <= 5.0 for _, elapsed, _ in cut), cut
    got = json.loads(out.stdout)
    (line,) = [n for n in got["pilot_notes"] if n.startswith("pilot: lane default:")]
    assert re.match(
        r"pilot: lane default: 10 answers, 8 more still running when cut off \(after \S+\): "
        r"its time per answer is at least \S+, about \S+ with a fitted tail \(\+/-\d+%\), "
        r"not pinned down$",
        line,
    ), line
    # At least: every cut-off answer at its time so far, the 10 answers at theirs.
    at_least = sum(e for _, e, _ in cut) / 18
    passages = sum(d["pending"] for d in got["datasets"])
    assert got["job"]["time_s"]["mean"] >= passages * at_least / 8


def test_cut_off_times_are_kept_once_per_item_until_it_is_answered(tmp_path: Path) -> None:
    """`Outstanding.cut_short`: one time per item and lane, its longest; a request a stop cut
    is in `outstanding` too and counts once, at the time it ran; an item since answered in the
    lane counts no more (its time is known), in another lane it still does."""
    from regen.conversation import Attempt, Message, Outcome, Result, Usage
    from regen.sources.modes import item_id
    from regen.state.db import Store
    from regen.state.outstanding import CutShort, Sent
    from tests.state.test_store import add, conv

    store = Store.open(tmp_path)
    try:
        c1, c2 = conv("q1", 0), conv("q2", 1)
        add(store, c1, 1)
        add(store, c2, 2)
        i1, i2 = item_id(c1.id, 1), item_id(c2.id, 1)
        run = store.runs.begin("pilot", None, {})
        store.commit_outcomes(
            [],
            cut=[
                CutShort(run, i1, "ds", "long", 3.0),
                CutShort(run, i1, "ds", "long", 5.0),
                CutShort(run, i1, "ds", "short", 1.0),
                CutShort(run, i2, "ds", "long", 2.0),
            ],
        )
        store.outstanding.write([Sent(1, run, i2, "ds", "long", None, 0.1, 10.0, 0.0, 1e12)])
        store.runs.end(run, "pilot time limit", "pilot bound")
        assert sorted(store.outstanding.cut_short()[("long", "ds")]) == [2.0, 5.0]
        answer = Result(i1, Message("assistant", "x"), "stop", Usage(10, 20, 5, 0.5))
        attempt = Attempt(1, 0.0, 7.0, 200, lane="long")
        store.commit_outcomes([Outcome(i1, "ds", (attempt,), result=answer)])
        assert store.outstanding.cut_short() == {("long", "ds"): [2.0], ("short", "ds"): [1.0]}
    finally:
        store.close()


def test_the_plans_time_per_answer_counts_answers_cut_off_still_running(
    tmp_path: Path,
) -> None:
    """Answers of 1 s, and as many again cut off after 8 s: the lane's time per passage is
    longer than the answers alone say (by the Kaplan-Meier curve's mean with them counted at
    least that long), and less sure; with none cut off the plan is what it was."""
    job = offline_job(tmp_path)
    entries = [passage("default", ds, "done", 1.0, 0.001) for ds in ("a", "b") for _ in range(20)]
    latencies = {"default": [1.0] * 40}
    pending = {("default", "a"): (1000, 100_000), ("default", "b"): (1000, 100_000)}
    ps = [progress("a", 1000), progress("b", 1000)]
    before = plan(job, ps, entries, latencies, pending, PRICES, {})
    assert before == plan(job, ps, entries, latencies, pending, PRICES, {}, None, censored={})
    cut = {("default", "a"): [8.0] * 20, ("default", "b"): [8.0] * 20}
    after = plan(job, ps, entries, latencies, pending, PRICES, {}, None, censored=cut)
    assert before.time_s is not None and after.time_s is not None
    factor = censored_factor([1.0] * 40, [8.0] * 40)
    # Half the answers last at least 8 s: the mean is at least 4.5 s, 4.5 times the answers'.
    assert factor >= 4.5
    assert after.time_s.mean == pytest.approx(before.time_s.mean * factor, rel=0.1)
    assert after.time_s.p90 / after.time_s.mean > before.time_s.p90 / before.time_s.mean
    from regen.engine.eta import Stat

    st = Stat(1.0, 0.5, 40)
    assert censored_stat(st, 1.0) is st
    assert censored_stat(st, 3.0).se >= 2.0  # what it adds is unsure by as much


def test_a_lane_whose_every_answer_was_cut_off_is_planned_no_shorter_than_they_ran(
    tmp_path: Path,
) -> None:
    """The long lane has no answer, only 6 cut off after 200 s each: its prior (4096 x 0.25
    tokens at 50 tok/s, about 21 s) would plan it ten times shorter than they are known to
    last; it is lifted to their mean, and says so."""
    from tests.conftest import two_lanes

    job = offline_job(tmp_path, two_lanes(4096))
    entries = [
        passage("short", ds, "escalated" if i < 6 else "done", 1.0, 0.001)
        for ds in ("a", "b")
        for i in range(30)
    ]
    pending = {("short", "a"): (1000, 100_000), ("short", "b"): (1000, 100_000)}
    ps = [progress("a", 1000), progress("b", 1000)]
    cut = {("long", "a"): [200.0] * 3, ("long", "b"): [200.0] * 3}
    before = plan(job, ps, entries, {}, pending, PRICES, {})
    after = plan(job, ps, entries, {}, pending, PRICES, {}, None, censored=cut)
    (long_before,) = [x for x in before.lanes if x.name == "long"]
    (long_after,) = [x for x in after.lanes if x.name == "long"]
    assert long_before.time_s is not None and long_after.time_s is not None
    # 400 escalations expected (6 of 30), 4 at once: at least 400 x 200 s / 4.
    assert long_after.time_s.mean >= long_after.passages * 200.0 / 4 * 0.95
    assert long_before.time_s.mean < long_after.time_s.mean / 5
    assert "at least 3m, as 6 cut off" in long_after.basis, long_after.basis
