"""Signals for the whole life of `regen run`: the first stops the run; a burst of SIGTERMs
changes nothing more (requests in flight finish, are committed and never paid twice); a second
Ctrl-C cuts them short; before the first request a signal stops at once; and every way out
prints the summary and frees the lock."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.errors import Interrupted
from regen.run.signals import stop_signals
from regen.sim import RunningSim, SimConfig, sim_in_thread
from tests.conftest import chat_rows, query, run_cli, start_cli, write_job, write_rows

HELD = 20


def _job(tmp: Path, url: str, rows: int = 200) -> Path:
    write_rows(tmp / "chat.jsonl", chat_rows(rows))
    return write_job(
        tmp,
        url,
        datasets=[("chat", "chat.jsonl", "openai")],
        concurrency=HELD,
        extra=f"initial_limit = {HELD}\nstop_grace_s = 60",
    )


def _read_until(proc: subprocess.Popen[str], prefix: str) -> list[str]:
    """stdout's lines up to and with the first that starts with `prefix`."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return seen
    raise AssertionError(f"no line starting {prefix!r} in {seen}")


@pytest.fixture
def held() -> Iterator[RunningSim]:
    """A simulator that answers 40 requests, then holds every request until released."""
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        sim.simulator.hold(after=40)
        yield sim


def _start_with_all_held(sim: RunningSim, job: Path) -> subprocess.Popen[str]:
    proc = start_cli("run", str(job))
    assert sim.simulator.wait_until(lambda: sim.simulator.held == HELD, 60)
    return proc


def test_a_burst_of_sigterms_stops_once_and_pays_nothing_twice(
    held: RunningSim, tmp_path: Path
) -> None:
    sim = held.simulator
    job = _job(tmp_path, held.base_url)
    proc = _start_with_all_held(held, job)
    proc.send_signal(signal.SIGTERM)
    _read_until(proc, f"stopping: no new requests; {HELD} in flight")
    for _ in range(20):  # as fast as the test can
        proc.send_signal(signal.SIGTERM)
    lines = _read_until(proc, "SIGTERM ignored: the run is stopping already")
    sim.release()
    rest, stderr = proc.communicate(timeout=90)
    stdout = "".join(lines) + rest
    assert proc.returncode == 5, stdout + stderr  # a graceful stop with items left
    assert stderr == ""
    assert "stopped: interrupted; run the same command again to resume" in stdout
    assert "dataset chat: 140 items not sent: the run was interrupted" in stdout
    assert stdout.count("SIGTERM ignored") == 1 and "stopping now" not in stdout
    out = tmp_path / "out"
    assert (out / "run.lock").read_text() == ""  # released
    # Every request in flight at the signal finished and was committed; none was sent after.
    assert query(out, "SELECT COUNT(*) FROM results") == [(40 + HELD,)]
    assert len(sim.chat_log()) == 40 + HELD
    assert query(out, "SELECT COUNT(*) FROM outstanding") == [(0,)]

    again = run_cli("run", str(job))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "took over the lock" not in again.stdout
    assert sim.wait_billed()
    billed = [e for e in sim.chat_log() if e.billed]
    assert len(billed) == 200 == len({e.digest for e in billed})  # no item paid twice


def test_ctrl_c_during_the_stop_cuts_requests_short_and_still_ends_cleanly(
    held: RunningSim, tmp_path: Path
) -> None:
    job = _job(tmp_path, held.base_url)
    proc = _start_with_all_held(held, job)
    proc.send_signal(signal.SIGTERM)
    _read_until(proc, "stopping: no new requests")
    proc.send_signal(signal.SIGINT)  # SIGTERM never cuts short; Ctrl-C does
    lines = _read_until(proc, f"stopping now (Ctrl-C again): {HELD} requests in flight")
    for _ in range(5):  # cut short already: these change nothing
        proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=90)
    held.simulator.release()
    stdout = "".join(lines) + rest
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    assert "aborted: requests in flight were cut short" in stdout
    assert "summary" in stdout
    out = tmp_path / "out"
    assert (out / "run.lock").read_text() == ""
    assert query(out, "SELECT COUNT(*) FROM results") == [(40,)]
    assert query(out, "SELECT COUNT(*) FROM items WHERE status = 'pending'") == [(160,)]


def test_a_signal_while_the_datasets_are_read_stops_at_once(
    sim: RunningSim, tmp_path: Path
) -> None:
    """The dataset is a FIFO: regen blocks reading it, and the test knows when (its open for
    writing returns once regen opened it to read)."""
    fifo = tmp_path / "chat.jsonl"
    os.mkfifo(fifo)
    job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
    proc = start_cli("run", str(job))
    opened: list[int] = []
    writer = threading.Thread(target=lambda: opened.append(os.open(fifo, os.O_WRONLY)))
    writer.start()
    writer.join(60)
    assert opened, "regen never opened its dataset"
    try:
        proc.send_signal(signal.SIGTERM)
        for _ in range(5):
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        os.close(opened[0])
    assert proc.returncode == 130, stdout + stderr
    assert stdout.endswith(
        "stopped: SIGTERM before the first request: nothing was sent, what was read is kept; "
        "run the same command again to resume\n"
    )
    assert "Traceback" not in stderr
    assert (tmp_path / "out" / "run.lock").read_text() == ""
    assert sim.simulator.chat_log() == []


def test_before_sending_the_first_signal_raises_and_the_rest_are_ignored(
    capfd: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info, stop_signals():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:  # the stop unwinds: more signals must not break it
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
    assert info.value.signal_name == "SIGTERM"
    assert capfd.readouterr().err == "SIGTERM ignored: the run is stopping already\n"
    assert signal.getsignal(signal.SIGTERM) == before


def test_at_the_end_signals_are_ignored_with_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    with stop_signals() as signals:
        signals.ending()
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
    assert capfd.readouterr().err == (
        "SIGINT ignored: the run is writing its exports, report and summary\n"
    )
