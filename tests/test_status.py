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
from tests.conftest import SECRET_KEY, chat_rows, run_cli, write_job, write_rows


def status(out: Path) -> dict[str, object]:
    proc = run_cli("status", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_status_json_of_a_running_job_and_then_of_the_finished_one(tmp_path: Path) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(300))
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("chat", "chat.jsonl", "openai")],
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
        job.write_text(job.read_text().replace("[run]", "[run]\nstop_error_rate = 1.0", 1))
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
