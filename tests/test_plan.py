"""`regen plan`: estimates before spending, checked against what the run then measures."""

from __future__ import annotations

import json
from pathlib import Path

from regen.demo import prepare_demo
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import query, run_cli


def spent(out: Path) -> dict[str, tuple[int, float]]:
    rows = query(
        out, "SELECT dataset, SUM(completion_tokens), SUM(cost_usd) FROM ledger GROUP BY dataset"
    )
    return {d: (int(t), float(c)) for d, t, c in rows}


def demo_job(tmp: Path, base_url: str) -> Path:
    job = prepare_demo(tmp / "demo")
    job.write_text(
        job.read_text()
        .replace("http://127.0.0.1:8787/api/v1", base_url)
        .replace('"OPENROUTER_API_KEY"', '"REGEN_TEST_KEY"')
    )
    return job


def test_plan_with_a_pilot_estimates_the_demo_run_within_25_percent(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=7, time_scale=0.05, credits_usd=50.0)) as sim:
        job = demo_job(tmp_path, sim.base_url)
        plan = run_cli("plan", str(job), "--pilot", "30", "--json")
        assert plan.returncode == 0, plan.stderr
        after_pilot = len(sim.simulator.chat_log())
        before = spent(tmp_path / "demo")
        run = run_cli("run", str(job))
        assert run.returncode == 0, run.stderr
    assert after_pilot == 90  # 30 per dataset, kept for the run
    estimates = json.loads(plan.stdout)
    after = spent(tmp_path / "demo")
    assert 49.0 < estimates["credit_usd"] < 50.0
    assert (
        estimates["coverage"].startswith("$49.9")
        and "covers every dataset" in (estimates["coverage"])
    )
    expected = measured = 0.0
    for e in estimates["datasets"]:
        assert e["basis"] == "30 answers" and e["pending"] == e["sent"] == e["items"] - 30
        tokens = after[e["name"]][0] - before[e["name"]][0]
        cost = after[e["name"]][1] - before[e["name"]][1]
        # 30 answers of a skewed length distribution: each dataset within 25%.
        assert abs(e["completion_tokens"] / tokens - 1) < 0.25, (e, tokens)
        assert abs(e["cost_usd"] / cost - 1) < 0.25, (e, cost)
        expected += e["cost_usd"]
        measured += cost
    assert abs(expected / measured - 1) < 0.25


def test_plan_without_answers_says_what_it_assumes_and_sends_nothing(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=7, time_scale=0.0)) as sim:
        job = demo_job(tmp_path, sim.base_url)
        job.write_text(
            job.read_text().replace('name = "code"', 'name = "code"\ntoken_budget = 2000')
        )
        plan = run_cli("plan", str(job))
        assert sim.simulator.chat_log() == []
    assert plan.returncode == 0, plan.stderr
    assert "no answers yet: max_tokens/4" in plan.stdout
    assert "pass --pilot N" in plan.stdout
    # code: 80 items of 512 expected tokens each, a budget of 2000: about 3 of them go out.
    assert "token budget: ~3 more" in plan.stdout
