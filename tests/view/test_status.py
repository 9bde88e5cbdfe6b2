"""`regen status`: read from another process while a job runs, and after it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import SECRET_KEY, add_to_section, chat_rows, run_cli, write_job, write_rows


def status(out: Path) -> dict[str, object]:
    proc = run_cli("status", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_status_json_of_a_running_job_and_then_of_the_finished_one(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            rows=300,
            extra="initial_limit = 16",
        )
        out = tmp_path / "out"
        sim.simulator.hold(after=40)  # 40 answers, then 16 requests in flight, unanswered
        run = subprocess.Popen(
            [sys.executable, "-m", "regen", "run", str(job)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY},
        )
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held == 16, 60)
            deadline = time.monotonic() + 60
            while True:  # until the 40 answers are committed and a progress line is written
                assert time.monotonic() < deadline and run.poll() is None
                live = status(out)
                (ds,) = live["datasets"]  # type: ignore[misc]
                if live["progress"] and ds["done"] == 40:
                    break
                time.sleep(0.05)
            assert live["running"] is True and live["pid"] == run.pid
            assert ds["name"] == "chat" and ds["items"] == 300 and ds["pending"] == 260
            assert ds["cost_usd"] > 0 and ds["usd_per_mtok"] > 0
            assert "in_flight" in live["progress"] and "req_s" in live["progress"]  # type: ignore[operator]
            run.send_signal(signal.SIGTERM)  # a graceful stop: what finished is kept
            while "stopping: no new requests" not in (out / "run.log").read_text():
                assert time.monotonic() < deadline and run.poll() is None
                time.sleep(0.05)
            sim.simulator.release()  # the 16 in flight end within the grace period, and count
            # Items are left, and the exit code says so.
            assert run.wait(timeout=60) == 5, run.stderr.read() if run.stderr else ""
        finally:
            if run.poll() is None:
                run.kill()
            if run.stderr:
                run.stderr.close()
        after = status(out)
        assert after["running"] is False and after["pid"] is None
        (ds,) = after["datasets"]  # type: ignore[misc]
        assert ds["done"] == 40 + 16

        # The same job with a model the provider does not know: every attempt fails.
        job.write_text(job.read_text().replace("kimi-k2.5", "no-such-model") + "limit = 3\n")
        add_to_section(job, "run", "stop_error_rate = 1.0")
        failed = run_cli("run", str(job), "--out", str(tmp_path / "out2"))
    # Every request gets the same error: the run stops, the items stay pending.
    assert failed.returncode == 1, failed.stderr
    assert "every request fails with the same error" in failed.stderr
    report = status(tmp_path / "out2")
    reasons = report["top_failure_reasons"]
    assert reasons and reasons[0]["class"] == "bad_request"  # type: ignore[index]
    assert "not a valid model ID" in reasons[0]["message"]  # type: ignore[index]
    assert report["recent_failures"][0]["failure_class"] == "bad_request"  # type: ignore[index]

    text = run_cli("status", str(tmp_path / "out2"))
    assert text.returncode == 0
    assert "not running" in text.stdout and "top failure reasons" in text.stdout


def test_status_of_a_directory_without_state_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("status", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr == f"error: {tmp_path}: no state.db here: not a regen output directory\n"


def test_status_and_report_say_how_each_run_ended(tmp_path: Path) -> None:
    """A pilot stopped with Ctrl-C is `interrupted`, not killed; a run killed with SIGKILL
    (it never records its end) is `killed` in `regen status` and report.html, not "done"; the
    run that finishes says so with its exit code; `status --json` gives numbers as numbers."""
    from tests.conftest import kill_at, query

    write_rows(tmp_path / "chat.jsonl", chat_rows(60))
    env = {**os.environ, "REGEN_TEST_KEY": SECRET_KEY}
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        out = tmp_path / "out"
        sim.simulator.hold(after=5)
        pilot = subprocess.Popen(
            [sys.executable, "-m", "regen", "plan", str(job), "--pilot", "30"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held > 0, 60)
            pilot.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 60
            log = out / "run.log"
            while not log.exists() or "stopping: no new requests" not in log.read_text():
                assert time.monotonic() < deadline and pilot.poll() is None
                time.sleep(0.05)
            sim.simulator.release()
            pilot.wait(timeout=60)
        finally:
            if pilot.poll() is None:
                pilot.kill()
            if pilot.stderr:
                pilot.stderr.close()
        assert kill_at(job, "start", 1, env=env) == 1
        done = run_cli("run", str(job))
        assert done.returncode == 0, done.stderr
    runs = status(out)["runs"]
    assert [(r["kind"], r["end_kind"]) for r in runs] == [  # type: ignore[index]
        ("pilot", "interrupted"),
        ("run", "killed"),
        ("run", "finished"),
    ], runs
    assert runs[-1]["exit_code"] == 0 and runs[-1]["ended"] == "finished (exit 0)"  # type: ignore[index]
    assert query(out, "SELECT exit_code FROM runs WHERE kind = 'pilot'") == [(None,)]
    progress = status(out)["progress"]
    assert isinstance(progress["in_flight"], int) and isinstance(progress["req_s"], float)  # type: ignore[index]
    # Read from state.db, where the run wrote them, not parsed back from run.log's text.
    (out / "run.log").unlink()
    assert status(out)["progress"] == progress
    text = run_cli("status", str(out)).stdout
    assert "pilot: started " in text and "; interrupted" in text, text
    assert "run 1: started " in text and "; killed (no end recorded" in text, text
    assert "run 2: started " in text and "; finished (exit 0)" in text, text
    html = (out / "report.html").read_text()
    assert "killed (no end recorded" in html and "<td>done</td>" not in html


def test_a_connection_dropped_by_a_server_back_at_once_is_not_an_outage(tmp_path: Path) -> None:
    """A server leaves the pool on a dropped connection and is probed 0.5 s later: back at that
    first probe, it was never out of service, and neither `regen status`, the report nor the
    run's end counts it; out for longer, or not back yet, it is an outage."""
    from regen.engine.runtime import Outage
    from regen.engine.stats import EndpointStats, RunStats
    from regen.run.summary import run_outages
    from regen.state.db import Store
    from regen.state.runs import OutageRecord

    store = Store.open(tmp_path)
    try:
        run_id = store.runs.begin("run", None, {})
        store.runs.save_outages(
            [
                OutageRecord(run_id, "gpu0", 100.0, 100.6, 1),  # back at the first probe
                OutageRecord(run_id, "gpu0", 200.0, 200.7, 2),
                OutageRecord(run_id, "gpu1", 300.0, 312.0, 9),  # down for 12 s
                OutageRecord(run_id, "gpu1", 400.0, None, 3),  # not back yet
            ]
        )
        kept = [(o.endpoint, o.started_at) for o in store.runs.outages()]
    finally:
        store.close()
    assert kept == [("gpu1", 300.0), ("gpu1", 400.0)]
    stats = RunStats(datasets={})
    stats.endpoints["gpu0"] = blips = EndpointStats()
    blips.outages += [Outage(100.0, 100.6), Outage(200.0, 200.7)]
    stats.endpoints["gpu1"] = down = EndpointStats()
    down.outages.append(Outage(300.0, 312.0))
    assert list(run_outages(stats)) == ["gpu1"]
    text = run_cli("status", str(tmp_path)).stdout
    assert "gpu0" not in text and "endpoint gpu1: " in text and "out of the pool 2 times" in text
