"""Exactly-once resume: `regen run` killed with SIGKILL at random moments and rerun, a lock per
output directory, and the fingerprint that guards a resumed job's settings."""

from __future__ import annotations

import json
import random
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import chat_rows, query, run_cli, start_cli, wait_for, write_job, write_rows

KILLS = 10
CHAT = [("chat", "chat.jsonl", "openai")]


def start_run(job: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return start_cli("run", str(job), *args, env=env)


def crash_points(rng: random.Random) -> list[str]:
    """Where each killed run dies (`REGEN_CRASH_AT`): at start-up, after a seeded number of
    committed answers, at the dataset boundary, and inside the run's export."""
    commits = [f"commit:{rng.randint(5, 90)}" for _ in range(KILLS - 4)]
    return ["start", *commits[:3], "dataset:more", *commits[3:], "export", "start"]


@pytest.mark.slow
def test_sigkill_at_named_and_seeded_points_then_rerun_loses_nothing_and_sends_nothing_twice(
    tmp_path: Path,
) -> None:
    rng = random.Random(20261202)
    # `more` outlasts the kills after its boundary (three at up to 90 committed answers,
    # each commit batch overshooting on a loaded machine): a run that ran out of items
    # before its crash point would end normally and prove nothing.
    n_items = 1000
    write_rows(tmp_path / "chat.jsonl", chat_rows(600))
    write_rows(tmp_path / "more.jsonl", chat_rows(400, prefix="More"))
    datasets = [*CHAT, ("more", "more.jsonl", "openai")]
    points = crash_points(rng)
    # Answers take a few milliseconds: each killed run has requests in flight.
    with sim_in_thread(SimConfig(seed=5, time_scale=0.02, log_bodies=True)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=datasets, concurrency=16)
        runs: list[tuple[float, bool]] = []  # (start, killed)
        export = tmp_path / "out" / "export"
        for point in points:
            runs.append((time.time(), True))
            proc = start_run(job, env={"REGEN_CRASH_AT": point})
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == -signal.SIGKILL, (point, err)
            if point == "export":  # it left a temporary file, and no half-written export
                assert list(export.glob(".*.tmp")), "the export kill did not land in it"
        runs.append((time.time(), False))
        final = run_cli("run", str(job))
        assert sim.simulator.wait_billed()
        log = sim.simulator.chat_log()
        billed_total = sim.simulator.billed_usd()
    assert final.returncode == 0, final.stdout + final.stderr
    assert not list(export.glob(".*.tmp"))
    log_text = (export.parent / "run.log").read_text()
    resumed = re.findall(r"dataset chat: resuming from (\d+) of", log_text)
    assert len(set(resumed)) >= KILLS // 2, "the killed runs committed answers"

    out = tmp_path / "out"
    # Every item is in the export exactly once.
    lines = [(export / f"{d}.jsonl").read_text().splitlines() for d in ("chat", "more")]
    ids = [json.loads(line)["id"] for line in lines[0] + lines[1]]
    assert len(ids) == n_items and len(set(ids)) == n_items
    assert set(ids) == {i for (i,) in query(out, "SELECT id FROM items WHERE status = 'done'")}

    # Nothing committed was sent again: every request for an item reached the simulator
    # before that item's result was committed.
    committed: dict[str, float] = {}
    for data, created in query(
        out,
        "SELECT c.data, r.created_at FROM results r JOIN items i ON i.id = r.item_id "
        "JOIN conversations c ON c.id = i.conversation_id",
    ):
        question = json.loads(str(data))["messages"][0]["content"]
        committed[question] = float(created)
    assert len(committed) == n_items
    for entry in log:
        if entry.body is None:  # killed while its body was on the way: never read, never billed
            assert entry.status == 499 and entry.digest is None, entry
            continue
        question = entry.body["messages"][-1]["content"]
        assert entry.at < committed[question], f"{question!r} sent after its result was committed"

    # The ledger holds every answer regen recorded, and the bills of the answers that were in
    # flight when a run was killed: the next run found them by their generation ids (`lost`).
    # The simulator billed exactly that, and what regen never saw a generation id of.
    ((ledger_total,),) = query(out, "SELECT SUM(cost_usd) FROM ledger")
    answered = {
        g for (g,) in query(out, "SELECT generation_id FROM ledger WHERE kind = 'completion'")
    }
    found = {g for (g,) in query(out, "SELECT generation_id FROM ledger WHERE kind = 'lost'")}
    billed = {e.generation_id for e in log if e.billed}
    assert len(answered) == n_items and answered | found <= billed
    lost = [e for e in log if e.billed and e.generation_id not in answered]
    # A request belongs to the last run started before it reached the simulator (one sent
    # just before a kill may arrive just after it).
    owners = [max(i for i, (start, _) in enumerate(runs) if start <= e.at) for e in lost]
    assert all(runs[i][1] for i in owners), "an answer of the final run is missing"
    assert len(set(owners)) >= KILLS // 2, "most kills must cut billed answers short"
    assert found and found <= {e.generation_id for e in lost}
    unseen = [e for e in lost if e.generation_id not in found]
    unseen_usd = sum(e.cost_usd for e in unseen)
    assert float(ledger_total) <= billed_total
    assert abs(billed_total - float(ledger_total) - unseen_usd) < 1e-9

    # The final reconciliation reports exactly that difference.
    reconcile = re.findall(r"difference_usd=([0-9.-]+)", (out / "run.log").read_text())
    assert abs(float(reconcile[-1]) - unseen_usd) < 2e-6
    if unseen:
        assert "billed on the key beyond this job's ledger" in final.stdout
    else:
        assert "they agree" in final.stdout


def test_resume_says_where_each_dataset_stands(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        write_rows(tmp_path / "a.jsonl", chat_rows(12, prefix="A"))
        write_rows(tmp_path / "b.jsonl", chat_rows(8, prefix="B"))
        datasets = [("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")]
        job = write_job(tmp_path, sim.base_url, datasets=datasets)
        first = run_cli("run", str(job))
        assert first.returncode == 0, first.stderr
        assert "dataset a: new, 12 items" in first.stdout
        assert "dataset b: new, 8 items" in first.stdout
        # Three finished items of b are forgotten, as if they were in flight at a crash.
        db = sqlite3.connect(tmp_path / "out" / "state.db")
        with db:
            gone = [r[0] for r in db.execute("SELECT item_id FROM results WHERE dataset = 'b'")]
            for iid in gone[:3]:
                db.execute("DELETE FROM results WHERE item_id = ?", (iid,))
                db.execute("UPDATE items SET status = 'pending' WHERE id = ?", (iid,))
        db.close()
        write_rows(tmp_path / "c.jsonl", chat_rows(5, prefix="C"))
        job.write_text(job.read_text() + '\n[[datasets]]\nname = "c"\npath = "c.jsonl"\n')
        second = run_cli("run", str(job))
        assert second.returncode == 0, second.stderr
        sent = len(sim.simulator.chat_log())
    assert "dataset a: complete" in second.stdout
    assert "dataset b: resuming from 5 of 8" in second.stdout
    assert "dataset c: new, 5 items" in second.stdout  # an added dataset is not a change
    assert sent == 12 + 8 + 3 + 5
    log = (tmp_path / "out" / "run.log").read_text()
    assert re.search(r"Z dataset b: resuming from 5 of 8\n", log)


def test_changed_temperature_is_refused_and_changed_limits_are_not(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        assert run_cli("run", str(job)).returncode == 0
        sent = len(sim.simulator.chat_log())
        original = job.read_text()

        job.write_text(original.replace("temperature = 0.7", "temperature = 0.9"))
        refused = run_cli("run", str(job))
        assert refused.returncode == 1
        (line,) = refused.stderr.splitlines()
        assert line.startswith("error: ") and "state.db" in line
        assert "generation.temperature: 0.7 -> 0.9" in line and "--force" in line

        # Concurrency, max_tokens, timeouts and the progress interval are not the data.
        job.write_text(
            original.replace("concurrency = 16", "concurrency = 3\ntimeout_s = 30")
            .replace("max_tokens = 512", "max_tokens = 1024")
            .replace("progress_interval_s = 0.5", "progress_interval_s = 2")
        )
        accepted = run_cli("run", str(job))
        assert accepted.returncode == 0, accepted.stderr
        assert "dataset chat: complete" in accepted.stdout

        job.write_text(original.replace("temperature = 0.7", "temperature = 0.9"))
        forced = run_cli("run", str(job), "--force")
        assert forced.returncode == 0, forced.stderr
        assert "resuming with changed settings (--force): generation.temperature" in forced.stdout
        assert run_cli("run", str(job)).returncode == 0  # the new settings are the job's now
        assert len(sim.simulator.chat_log()) == sent


def test_a_second_run_on_one_output_directory_is_refused_and_a_dead_holder_is_taken_over(
    tmp_path: Path,
) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(200))
    with sim_in_thread(SimConfig(seed=2, time_scale=0.5)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=CHAT, concurrency=4)
        holder = start_run(job)
        try:
            wait_for(lambda: sim.simulator.chat_log(), "a request at the simulator", 30)
            second = run_cli("run", str(job))
            assert second.returncode == 1
            assert f"another regen run (pid {holder.pid}) is using this output directory" in (
                second.stderr
            )
            holder.send_signal(signal.SIGKILL)
            holder.communicate(timeout=30)
        finally:
            if holder.poll() is None:
                holder.kill()
        # The holder died without releasing its lock: the next run takes it over.
        job.write_text(job.read_text().replace("concurrency = 4", "concurrency = 64"))
        sim.simulator.config = sim.simulator.config.model_copy(update={"time_scale": 0.0})
        third = run_cli("run", str(job))
    assert third.returncode == 0, third.stderr
    assert f"took over the lock of pid {holder.pid}" in third.stdout
    assert (tmp_path / "out" / "run.lock").read_text() == ""  # released cleanly this time
