"""Keys a job makes for itself with a management key: OpenRouter enforces the job's cap, and
the keys' usage is the job's own spend, whoever else uses the account."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import chat_rows, kill_at, query, run_cli, write_job, write_rows

MANAGEMENT = "sk-mgmt-test-0123456789abcdef"


def managed_job(tmp: Path, base_url: str, rows: int, cap: float, concurrency: int = 32) -> Path:
    write_rows(tmp / "chat.jsonl", chat_rows(rows))
    job = write_job(
        tmp, base_url, datasets=[("chat", "chat.jsonl", "openai")], concurrency=concurrency
    )
    text = job.read_text().replace(
        'api_key_env = "REGEN_TEST_KEY"', 'management_key_env = "REGEN_TEST_MANAGEMENT_KEY"'
    )
    job.write_text(text + f"\n[budget]\nmax_cost_usd = {cap}\n")
    return job


@pytest.mark.slow
def test_each_run_makes_its_own_key_and_the_keys_hold_the_cap_across_kills(
    tmp_path: Path,
) -> None:
    cap = 0.3
    env = {**os.environ, "REGEN_TEST_MANAGEMENT_KEY": MANAGEMENT}
    config = SimConfig(seed=3, time_scale=0.2, management_keys=[MANAGEMENT])
    with sim_in_thread(config) as sim:
        job = managed_job(tmp_path, sim.base_url, 400, cap)
        kills = kill_at(job, "commit:30", 2, env=env)
        final = run_cli("run", str(job), env={"REGEN_TEST_MANAGEMENT_KEY": MANAGEMENT})
        assert sim.simulator.wait_billed(60)
        keys = sim.simulator.keys.listed(include_disabled=True)
        usage = {k.hash: sim.simulator.account.usage_of(k.secret) for k in keys}
        billed = sim.simulator.billed_usd()
        secrets = [k.secret for k in keys]
    assert kills == 2
    assert final.returncode == 4, final.stdout + final.stderr
    assert "stopped: the job's dollar cap [budget].max_cost_usd = 0.3 is met" in final.stdout
    assert len(keys) == 3 and all(k.disabled for k in keys)  # one per run, each disabled
    assert billed <= cap
    out = tmp_path / "out"
    ((ledger,),) = query(out, "SELECT SUM(cost_usd) FROM ledger")
    ((held, named),) = query(
        out, "SELECT COALESCE(SUM(worst_usd), 0), COUNT(generation_id) FROM outstanding"
    )
    # The keys' usage is exactly the job's spend. The ledger has all of it but the bills of
    # requests killed before their responses named them, which stay held for the next run.
    assert abs(sum(usage.values()) - billed) < 1e-9
    assert named == 0 and float(ledger) - 1e-9 <= billed <= float(ledger) + float(held) + 1e-9
    # No key used more than its limit: the run's own admission kept within it.
    assert all(usage[k.hash] <= (k.limit or 0) + 1e-9 for k in keys)
    recorded = json.loads(query(out, "SELECT value FROM meta WHERE key = 'job_keys'")[0][0])
    assert {k["hash"] for k in recorded} == set(usage)
    # The secrets live in the processes only.
    stored = (out / "state.db").read_bytes() + (out / "run.log").read_bytes()
    assert not any(secret.encode() in stored for secret in secrets)
    assert MANAGEMENT.encode() not in stored


def test_the_keys_are_deleted_once_the_job_is_done(tmp_path: Path) -> None:
    config = SimConfig(seed=3, time_scale=0.0, management_keys=[MANAGEMENT])
    with sim_in_thread(config) as sim:
        job = managed_job(tmp_path, sim.base_url, 40, 5.0)
        proc = run_cli("run", str(job), env={"REGEN_TEST_MANAGEMENT_KEY": MANAGEMENT})
        left = sim.simulator.keys.listed(include_disabled=True)
        billed = sim.simulator.billed_usd()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert left == []
    assert "key: made a key for this run" in proc.stdout
    assert "(the keys made for the job): they agree" in proc.stdout
    recorded = json.loads(
        query(tmp_path / "out", "SELECT value FROM meta WHERE key = 'job_keys'")[0][0]
    )
    assert [k["deleted"] for k in recorded] == [True]
    assert abs(recorded[0]["usage_usd"] - billed) < 1e-9


def test_a_key_that_is_not_a_management_key_is_one_line_naming_the_variable(
    tmp_path: Path,
) -> None:
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:  # no management keys
        job = managed_job(tmp_path, sim.base_url, 10, 1.0)
        proc = run_cli("run", str(job), env={"REGEN_TEST_MANAGEMENT_KEY": "sk-not-management"})
        sent = len(sim.simulator.chat_log())
    assert proc.returncode == 1 and sent == 0
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: the management key in REGEN_TEST_MANAGEMENT_KEY was refused")
    assert "sk-not-management" not in line
    missing = run_cli("run", str(job), env={"REGEN_TEST_MANAGEMENT_KEY": ""})
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "error: set REGEN_TEST_MANAGEMENT_KEY or name another variable in "
        "[endpoint].management_key_env"
    )
