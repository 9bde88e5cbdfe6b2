"""`regen run` as a subprocess against a simulator with faults: retries, lanes, signals."""

from __future__ import annotations

import gc
import json
import re
import signal
from pathlib import Path

from regen.run.dispatch import quiet_gc
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from tests.conftest import chat_rows, query, run_cli, start_cli, write_job, write_rows

LANES = """
[[lanes]]
name = "short"
concurrency = 16
max_tokens = 2048
datasets = ["chat"]

[[lanes]]
name = "long"
concurrency = 8
max_tokens = 4096
stream = true
"""


def two_lane_job(tmp: Path, url: str, extra: str) -> Path:
    write_rows(tmp / "chat.jsonl", chat_rows(60))
    write_rows(tmp / "code.jsonl", chat_rows(40, prefix="Write code"))
    job = write_job(
        tmp,
        url,
        datasets=[("chat", "chat.jsonl", "openai"), ("code", "code.jsonl", "openai")],
        extra=extra,
    )
    job.write_text(job.read_text().replace("[[datasets]]", LANES + "\n[[datasets]]", 1))
    return job


def test_transient_faults_at_high_rates_end_with_every_item_done(tmp_path: Path) -> None:
    faults = SimFaults(
        http_5xx=0.12,
        http_408=0.03,
        reset=0.05,
        stall=0.03,
        stall_s=1.0,
        error_200=0.04,
        midstream_error=0.05,
        cold_start=0.04,
    )
    with sim_in_thread(SimConfig(seed=4, time_scale=0, faults=faults)) as sim:
        job = two_lane_job(
            tmp_path, sim.base_url, "max_attempts = 10\nidle_timeout_s = 0.3\nstop_error_rate = 0.9"
        )
        proc = run_cli("run", str(job))
        log = sim.simulator.chat_log()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    assert query(out, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("done", 100)]
    classes = {c for (c,) in query(out, "SELECT DISTINCT failure_class FROM attempts")}
    assert {"server", "connection", "invalid_response", "timeout", "stalled"} <= classes
    assert query(out, "SELECT lane, COUNT(*) FROM items GROUP BY lane ORDER BY lane") == [
        ("long", 40),
        ("short", 60),
    ]
    streamed = [e for e in log if e.stream]
    assert len(streamed) >= 40 and all(e.model for e in streamed if e.status == 200)
    for name, n in (("chat", 60), ("code", 40)):
        lines = (out / "export" / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == n and len({json.loads(x)["id"] for x in lines}) == n


def test_sigterm_stops_dispatch_commits_what_finished_and_exits_0(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            rows=400,
            concurrency=20,
            extra="initial_limit = 20\nstop_grace_s = 60",
        )
        # 60 answers, then every request waits unanswered: the signal comes with all 20 in
        # flight, and none of them can end before the run has seen it.
        sim.simulator.hold(after=60)
        proc = start_cli("run", str(job))
        assert sim.simulator.wait_until(lambda: sim.simulator.held == 20, 60)
        sent_at_signal = len(sim.simulator.chat_log())
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        for line in proc.stdout:  # the run says it is stopping, then the held answers come
            if line.startswith("stopping: no new requests; 20 in flight"):
                break
        sim.simulator.release()
        stdout, stderr = proc.communicate(timeout=90)
        sent = len(sim.simulator.chat_log())
    assert proc.returncode == 5, stderr  # items left: the exit code says so
    assert "stopped: interrupted" in stdout
    assert re.search(r"dataset chat: \d+ items not sent: the run was interrupted", stdout)
    assert sent == sent_at_signal == 80  # nothing was sent after the signal
    out = tmp_path / "out"
    (done,) = query(out, "SELECT COUNT(*) FROM results")[0]
    assert done == sent  # every request in flight at the signal finished and was committed
    assert query(out, "SELECT COUNT(*) FROM items WHERE status = 'pending'") == [(400 - done,)]
    assert len((out / "export" / "chat.jsonl").read_text().splitlines()) == done
    assert "stopping: no new requests" in (out / "run.log").read_text()


def test_insufficient_credits_stops_the_run_cleanly(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(time_scale=0, credits_usd=0.01)) as sim:
        job = write_job(tmp_path, sim.base_url, rows=200, concurrency=4)
        proc = run_cli("run", str(job))
        billed = sim.simulator.billed_usd()
    assert proc.returncode == 1
    assert "error: run stopped: insufficient_credits: This request requires more credits" in (
        proc.stderr
    )
    out = tmp_path / "out"
    (done,) = query(out, "SELECT COUNT(*) FROM results")[0]
    assert 0 < done < 200
    (cost,) = query(out, "SELECT SUM(cost_usd) FROM ledger")[0]
    assert abs(float(cost) - billed) < 1e-9  # type: ignore[arg-type]


def test_the_run_gives_the_garbage_collector_back_as_it_found_it() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with quiet_gc():
        assert gc.get_threshold()[0] == 50_000 and gc.get_freeze_count() > frozen
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
