"""An endpoint pool of three self-hosted servers (`regen sim --dialect vllm` processes), one
killed with SIGKILL mid-run and restarted on its port: nothing is lost or answered twice, the
run finishes on the other two, and it sends to the restarted server again.

The test moves on events, not on time: it kills the server once a number of answers are
committed, and restarts it once more are.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import free_port, run_cli, wait_for, write_rows

MODEL = "qwen/qwen3-8b"
ITEMS = 600
SIM_TOML = f"""
dialect = "vllm"
served_model = "{MODEL}"
seed = 11
time_scale = 0.2
"""


def start_server(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """A simulator process, returned once it listens (it says so in its log)."""
    cfg = tmp / "sim.toml"
    cfg.write_text(SIM_TOML)
    log = tmp / f"sim-{port}-{time.monotonic_ns()}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "regen", "sim", "--config", str(cfg), "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while "listening on" not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the simulator did not start within 60 s"
        time.sleep(0.02)
    return proc


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/stats", timeout=10) as resp:
        data: dict[str, Any] = orjson.loads(resp.read())
        return data


def answers(out: Path) -> int:
    if not (out / "state.db").exists():
        return 0
    db = sqlite3.connect(out / "state.db", timeout=30)
    try:
        return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()


def back_in_pool(log: Path, after: int) -> bool:
    """Whether a progress line written after byte `after` of run.log has every endpoint in the
    pool (the line names `endpoints_out=` only while one is out)."""
    with log.open("rb") as f:
        f.seek(after)
        lines = f.read().decode(errors="replace").splitlines()
    return any(" progress done=" in line and "endpoints_out=" not in line for line in lines[1:])


def start_regen(job: Path) -> subprocess.Popen[bytes]:
    """`regen run JOB` as a process, with no key in its environment (vLLM needs none)."""
    env = {k: v for k, v in os.environ.items() if k != "REGEN_NO_KEY_NEEDED"}
    return subprocess.Popen(
        [sys.executable, "-m", "regen", "run", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


@contextmanager
def servers(tmp: Path, ports: list[int]) -> Iterator[dict[int, subprocess.Popen[bytes]]]:
    procs = {port: start_server(tmp, port) for port in ports}
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.mark.slow
def test_a_pool_survives_a_killed_server_and_takes_it_back(tmp_path: Path) -> None:
    write_rows(
        tmp_path / "chat.jsonl",
        [
            {"messages": [{"role": "user", "content": f"Question {i}: say hello."}]}
            for i in range(ITEMS)
        ],
    )
    ports = [free_port() for _ in range(3)]
    endpoints = "".join(
        f'\n[[endpoints]]\nname = "gpu{i}"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        'dialect = "vllm"\napi_key_env = "REGEN_NO_KEY_NEEDED"\ntoken_ids = true\n'
        for i, port in enumerate(ports)
    )
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\noutput_dir = "out"\n{endpoints}\n[generation]\nmodel = "{MODEL}"\n'
        "max_tokens = 300\n[run]\nconcurrency = 24\nprogress_interval_s = 0.5\n"
        '[[datasets]]\nname = "chat"\npath = "chat.jsonl"\n'
    )
    out = tmp_path / "out"
    victim = ports[1]
    with servers(tmp_path, ports) as procs:
        run = start_regen(job)
        try:
            wait_for(lambda: answers(out) >= ITEMS // 6, f"{ITEMS // 6} answers", process=run)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=10)
            killed_at = answers(out)
            wait_for(
                lambda: answers(out) >= killed_at + ITEMS // 6,
                "answers after the kill",
                process=run,
            )
            # The survivors are paused while the victim comes back, so that the run cannot end
            # before the pool has taken it back, however fast or loaded the machine is; once
            # they go on, the victim (no requests outstanding) takes the next items.
            survivors_procs = [procs[p] for p in ports if p != victim]
            for proc in survivors_procs:
                proc.send_signal(signal.SIGSTOP)
            assert answers(out) < ITEMS, "the run ended before the victim was restarted"
            log = out / "run.log"
            seen = log.stat().st_size
            procs[victim] = start_server(tmp_path, victim)
            wait_for(lambda: back_in_pool(log, seen), "the victim back in the pool", process=run)
            for proc in survivors_procs:
                proc.send_signal(signal.SIGCONT)
            stdout, stderr = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        after_restart = stats(victim)
        survivors = [stats(p) for p in ports if p != victim]
    text = stdout.decode() + stderr.decode()
    assert run.returncode == 0, text
    db = sqlite3.connect(out / "state.db")
    try:
        done = db.execute("SELECT COUNT(*) FROM items WHERE status = 'done'").fetchone()[0]
        results = db.execute("SELECT COUNT(*), COUNT(DISTINCT item_id) FROM results").fetchone()
        exported = len((out / "export" / "chat.jsonl").read_text().splitlines())
        outages = db.execute(
            "SELECT endpoint, ended_at > started_at, resent FROM outages"
        ).fetchall()
        failed_on_victim = db.execute(
            "SELECT COUNT(*) FROM attempts WHERE endpoint = 'gpu1' AND failure_class IS NOT NULL"
        ).fetchone()[0]
    finally:
        db.close()
    assert done == ITEMS, text  # nothing lost
    assert results == (ITEMS, ITEMS) and exported == ITEMS  # nothing answered twice
    assert after_restart["chat_requests"] > 0, "the restarted server got requests again"
    assert all(s["chat_requests"] > 0 for s in survivors)
    # One kill is one outage, however many of its requests failed (each was counted as one).
    assert len(outages) == 1 and outages[0][:2] == ("gpu1", 1), outages
    assert outages[0][2] == failed_on_victim > 0
    assert re.search(r"endpoint gpu1: out of the pool 1 time \(.*; \d+ requests? re-sent", text)
    assert re.search(r"endpoints\s.*gpu0.*gpu1.*gpu2", text, re.S), text
    # `regen status` has a line per endpoint, the outage on gpu1's.
    status = run_cli("status", str(out)).stdout
    lines = dict(re.findall(r"endpoint (gpu\d): (.*)", status))
    assert set(lines) == {"gpu0", "gpu1", "gpu2"}, status
    assert "out of the pool 1 time" in lines["gpu1"], status
    assert sum(int(line.split()[0]) for line in lines.values()) == ITEMS


def single_server_job(tmp_path: Path, port: int, extra: str = "") -> Path:
    write_rows(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": f"Question {i}: say hi."}]} for i in range(300)],
    )
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\noutput_dir = "out"\n[endpoint]\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        f'dialect = "vllm"\napi_key_env = "REGEN_NO_KEY_NEEDED"\n[generation]\nmodel = "{MODEL}"\n'
        f"max_tokens = 300\n[run]\nconcurrency = 16\nprogress_interval_s = 0.5\n{extra}\n"
        '[[datasets]]\nname = "chat"\npath = "chat.jsonl"\n'
    )
    return job


@pytest.mark.slow
def test_a_single_server_that_restarts_is_waited_for_not_given_up_on(tmp_path: Path) -> None:
    """With one server, a restart ended the run after about 14 s: every request failed on the
    connection until the items ran out of attempts. Its items wait for its /health instead,
    without using up attempts, and the run finishes when it is back."""
    port = free_port()
    job = single_server_job(tmp_path, port)
    out = tmp_path / "out"
    with servers(tmp_path, [port]) as procs:
        run = start_regen(job)
        try:
            wait_for(lambda: answers(out) >= 40, "40 answers", process=run)
            procs[port].send_signal(signal.SIGKILL)
            procs[port].wait(timeout=10)
            # Down for a while: the run must wait (it once gave up in 14 s), not fail items.
            down_until = time.monotonic() + 3
            while time.monotonic() < down_until:
                assert run.poll() is None, "the run ended while its only server was down"
                time.sleep(0.1)
            procs[port] = start_server(tmp_path, port)
            stdout, stderr = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
    text = stdout.decode() + stderr.decode()
    assert run.returncode == 0, text
    db = sqlite3.connect(out / "state.db")
    try:
        statuses = db.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall()
    finally:
        db.close()
    assert statuses == [("done", 300)], text
    assert "endpoint default: out of the pool 1 time" in text, text


def test_a_pool_whose_servers_stay_down_stops_after_its_bound_with_items_pending(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    job = single_server_job(tmp_path, port, extra="pool_down_timeout_s = 1.5")
    started = time.monotonic()
    run = start_regen(job)
    stdout = run.communicate(timeout=120)[0].decode()
    assert run.returncode == 5, stdout
    assert "stopped: every server of lane default (default) has been down for 1.5 s" in stdout
    assert "start them (or raise [run].pool_down_timeout_s)" in stdout
    assert time.monotonic() - started < 60
    db = sqlite3.connect(tmp_path / "out" / "state.db")
    try:
        statuses = db.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall()
    finally:
        db.close()
    assert statuses == [("pending", 300)]
