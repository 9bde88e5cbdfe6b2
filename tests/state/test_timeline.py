"""Runs and their timeline in state.db: what the report draws and the plan reads back."""

from __future__ import annotations

from pathlib import Path

from regen.sim import SimConfig, sim_in_thread
from regen.state.db import Store
from tests.conftest import run_cli, two_lanes, write_job


def test_each_run_and_pilot_is_recorded_with_its_lanes_and_a_timeline(tmp_path: Path) -> None:
    lanes = two_lanes(long_max_tokens=2048)
    # time_scale > 0: answers take time, so the one-second sampler sees requests on the wire.
    with sim_in_thread(SimConfig(seed=3, time_scale=0.02)) as sim:
        job = write_job(tmp_path, sim.base_url, extra="[budget]\nmax_cost_usd = 5.0\n" + lanes)
        assert run_cli("plan", str(job), "--pilot", "5").returncode == 0
        run = run_cli("run", str(job))
        assert run.returncode == 0, run.stderr
    store = Store.open_readonly(tmp_path / "out")
    try:
        runs = store.runs.all()
        points = store.runs.timeline()
        attempts = list(store.spend.attempt_facts())
        charges = list(store.spend.ledger_facts())
    finally:
        store.close()
    assert [r.kind for r in runs] == ["pilot", "run"]
    pilot, full = runs
    assert pilot.ended_at is not None and pilot.ended_at <= full.started_at
    assert full.ended_at is not None and full.ended_at >= full.started_at
    assert full.max_cost_usd == 5.0
    assert full.lanes == {
        "short": {"max_tokens": 256, "concurrency": 8, "escalate_to": "long"},
        "long": {"max_tokens": 2048, "concurrency": 4, "escalate_to": None},
    }
    # A first point per lane as each run starts, then one a second.
    for r in runs:
        assert {p.lane for p in points if p.run_id == r.id} == {"short", "long"}
    assert all(p.in_flight <= p.concurrency and p.limit <= p.concurrency for p in points)
    # Every attempt names its lane; an escalated item's first answer went out on `short`
    # and was charged as `escalated`.
    assert {a.lane for a in attempts} <= {"short", "long"} and attempts
    escalated = [c for c in charges if c[2] == "escalated"]
    long_attempts = [a for a in attempts if a.lane == "long"]
    assert len(long_attempts) >= len(escalated) > 0
