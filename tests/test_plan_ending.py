"""How `regen plan` says a capped job ends: the datasets and items the cap leaves pending, as
the run's own order leaves them (regen.run.ending)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.run.ending import Flow, Lane, play
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import chat_rows, query, run_cli, write_job, write_rows

LANES = """
[[lanes]]
name = "short"
concurrency = 8
max_tokens = 256
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 2
max_tokens = 4096
"""


def test_a_slow_long_lane_leaves_its_backlog_of_every_dataset_unsent() -> None:
    """Two datasets through a fast short lane that escalates half its answers to a slow long
    lane: the short lane is through early, and the cap binds while the long lane works its
    backlog, so what stays pending is escalated items of both datasets, none of them unsent
    on the short lane."""
    flows = {
        ("short", "a"): Flow(0.1, 0.001, 0.5, 1.0),
        ("short", "b"): Flow(0.1, 0.001, 0.5, 1.0),
        ("long", "a"): Flow(1.0, 0.01, 0.0, 2.0),
        ("long", "b"): Flow(1.0, 0.01, 0.0, 2.0),
    }
    lanes = [Lane("short", [("a", 100), ("b", 100)], "long"), Lane("long", [])]
    # Every item: 200 x $0.001 on the short lane, 100 escalated x $0.01 on the long one.
    assert play(lanes, flows, 1.21) is None
    ending = play(lanes, flows, 0.7)
    assert ending is not None
    assert sum(ending.unsent.values()) == pytest.approx(50, abs=1)
    # Both datasets' escalations wait in the long lane's backlog, mixed as they came.
    assert ending.unsent["a"] == pytest.approx(ending.unsent["b"], rel=0.35)
    assert ending.escalated == pytest.approx(ending.unsent)
    # A lane that keeps pace with its escalations leaves the last dataset's own items.
    fast = {**flows, **{("long", d): Flow(0.05, 0.01, 0.0, 0.1) for d in "ab"}}
    ending = play(lanes, fast, 0.7)
    assert ending is not None and ending.unsent.get("a", 0.0) < 1
    # At most 200 - 0.7 / 0.006 of b's own (every item's escalation paid with it), a few
    # fewer: escalations still in flight when the room runs out are not started yet.
    own_b = ending.unsent["b"] - ending.escalated["b"]
    assert 200 - 0.7 / 0.006 - 12 < own_b < 200 - 0.7 / 0.006 + 0.5


def pending_by_dataset(out: Path) -> dict[str, int]:
    rows = query(out, "SELECT dataset, COUNT(*) FROM items WHERE status = 'pending' GROUP BY 1")
    return {d: int(n) for d, n in rows}


def test_the_plan_names_the_items_a_binding_cap_leaves_as_the_run_leaves_them(
    tmp_path: Path,
) -> None:
    """A pilot, then the plan of a job whose cap stops it, then the run. The short lane
    escalates most answers to a long lane of 2, which falls behind: the cap binds while it
    works its backlog, so every dataset, the first too, keeps escalated items pending. The
    plan's items left per dataset are the run's, within a fifth of the total and a few items;
    their total within a quarter."""
    for name in "abc":
        write_rows(tmp_path / f"{name}.jsonl", chat_rows(90, f"Topic {name}"))
    datasets = [(n, f"{n}.jsonl", "openai") for n in "abc"]
    with sim_in_thread(SimConfig(seed=3, time_scale=0.02)) as sim:
        free = write_job(tmp_path, sim.base_url, datasets=datasets, extra=LANES)
        pilot = run_cli("plan", str(free), "--pilot", "30", "--pilot-share", "1", "--json")
        assert pilot.returncode == 0, pilot.stderr
        before = json.loads(pilot.stdout)
        cap = before["spent_usd"] + 0.6 * before["job"]["cost_usd"]["mean"]
        budget = f"[budget]\nmax_cost_usd = {cap}\n"
        job = write_job(tmp_path, sim.base_url, datasets=datasets, extra=budget + LANES)
        planned = run_cli("plan", str(job), "--json")
        assert planned.returncode == 0, planned.stderr
        run = run_cli("run", str(job))
    assert run.returncode == 4, run.stdout  # the cap stops it
    p = json.loads(planned.stdout)
    said = {d["name"]: d["pending"] - d["sent"] for d in p["datasets"]}
    left = pending_by_dataset(tmp_path / "out")
    total = sum(left.values())
    assert abs(p["job"]["unsent"] - sum(said.values())) <= 1
    assert abs(sum(said.values()) - total) <= 0.25 * total + 3, (said, left)
    for name in "abc":
        assert abs(said[name] - left.get(name, 0)) <= 0.2 * total + 3, (said, left)
        assert f"{name} ({said[name]})" in p["job"]["stop"]
    # What stays is escalated: its first try paid, and the plan says so.
    assert "escalated items whose cut-off first try is paid" in p["job"]["stop"]
