"""A run's first ETA after a pilot whose provider refused requests for capacity: it rests on
what the provider let the pilot keep on the wire, as the plan does, not on the lane's limit
that its refused requests fill at once."""

from __future__ import annotations

import json
from pathlib import Path

from regen.sim import sim_in_thread
from tests.conftest import refusing_sim, run_cli, write_job
from tests.view.test_progress_metrics import parse_progress


def test_the_first_eta_after_a_refusing_pilot_is_the_plans_pace_not_the_lanes_limit(
    tmp_path: Path,
) -> None:
    # A lane of 64 against a provider that answers 6 at once. Until the run measured its own
    # pace its first ETAs took the 64 its refused requests fill at once as the pace: about ten
    # times short here (bench/plan.py's `capacity`: 3.4 times, outside the range shown).
    with sim_in_thread(refusing_sim(6, seed=4)) as sim:
        job = write_job(
            tmp_path, sim.base_url, concurrency=64, rows=400, extra="initial_limit = 64\n"
        )
        plan = run_cli("plan", str(job), "--pilot", "40", "--pilot-usd", "1", "--json")
        assert plan.returncode == 0, plan.stderr
        run = run_cli("run", str(job))
    assert run.returncode == 0, run.stderr
    planned = json.loads(plan.stdout)
    (lane,) = planned["lanes"]
    assert lane["on_wire"] is not None and lane["on_wire"] < 32, lane
    wall = planned["job"]["time_s"]["mean"]
    log = (tmp_path / "out" / "run.log").read_text()
    run_lines = parse_progress(log[log.index("dataset chat: resuming from") :])
    first = next(f for f in run_lines if f["eta_s"] not in ("-", "0"))
    # A share of what the pilot had answered at once is a guess: shown as a range, `prior`,
    # about the plan's figure (before: about a tenth of it, the range far below).
    assert first.get("eta_basis") == "prior", first
    assert float(first["eta_p10_s"]) < wall < float(first["eta_p90_s"]), (wall, first)
    assert wall / 3 < float(first["eta_s"]) < wall * 3, (wall, first)
