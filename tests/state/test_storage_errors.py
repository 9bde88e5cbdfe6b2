"""A full disk or a read-only output directory: one clear line, and nothing already done lost."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import SECRET_KEY, chat_rows, query, run_cli, start_cli, write_job, write_rows

CHAT = [("chat", "chat.jsonl", "openai")]


def counts(out: Path) -> tuple[str, dict[str, int]]:
    ((check,),) = query(out, "PRAGMA integrity_check")
    return check, dict(query(out, "SELECT status, COUNT(*) FROM items GROUP BY status"))


def exported_ids(out: Path) -> list[str]:
    lines = (out / "export" / "chat.jsonl").read_text().splitlines()
    return [json.loads(line)["id"] for line in lines]


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_every_committed_result(
    tmp_path: Path,
) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(50))
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        # A failed write is tried again for stop_grace_s: keep that short here.
        job = write_job(tmp_path, sim.base_url, datasets=CHAT, extra="stop_grace_s = 0.5")
        assert run_cli("run", str(job)).returncode == 0
        out = tmp_path / "out"
        write_rows(tmp_path / "chat.jsonl", chat_rows(400))
        # No file may grow past the largest one now plus 300 kB: the state.db write-ahead log
        # fills up once some new answers come back. (Python ignores SIGXFSZ, so the write
        # fails with EFBIG, as a full disk fails with ENOSPC.)
        cap = max(p.stat().st_size for p in out.rglob("*") if p.is_file()) + 300_000

        def limit_file_size() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

        full = subprocess.run(
            [sys.executable, "-m", "regen", "run", str(job)],
            capture_output=True,
            text=True,
            env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY},
            preexec_fn=limit_file_size,
            timeout=120,
            check=False,
        )
        assert full.returncode == 1, full.stdout + full.stderr
        (line,) = full.stderr.splitlines()
        assert line.startswith(f"error: {out / 'state.db'}: write failed: ")
        assert "disk may be full" in line and "could not be saved" in line
        check, by_status = counts(out)
        assert check == "ok"
        assert 50 <= by_status["done"] < 400 and by_status["pending"] > 0

        again = run_cli("run", str(job))
        assert again.returncode == 0, again.stderr
    ids = exported_ids(out)
    assert len(ids) == 400 and len(set(ids)) == 400
    assert counts(out) == ("ok", {"done": 400})


def _unshare() -> str:
    tool = shutil.which("unshare")
    probe = tool and subprocess.run([tool, "--mount", "true"], capture_output=True, check=False)
    if not probe or probe.returncode != 0:
        pytest.skip("needs `unshare --mount` (Linux, root) to mount a directory read-only")
    return str(tool)


def test_a_read_only_output_directory_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    unshare = _unshare()
    write_rows(tmp_path / "chat.jsonl", chat_rows(30))
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=CHAT)
        job.write_text(job.read_text() + "limit = 10\n")
        assert run_cli("run", str(job)).returncode == 0
        out = tmp_path / "out"
        before = counts(out)
        job.write_text(job.read_text().replace("limit = 10\n", ""))
        # The output directory, mounted read-only in a mount namespace of its own.
        script = (
            f'mount --bind "{out}" "{out}" && mount -o remount,bind,ro "{out}" && '
            f'exec "{sys.executable}" -m regen run "{job}"'
        )
        ro = subprocess.run(
            [unshare, "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
            env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY},
            timeout=120,
            check=False,
        )
        assert ro.returncode == 1, ro.stdout + ro.stderr
        (line,) = ro.stderr.splitlines()
        assert line == (
            f"error: {out}: cannot use output directory: [Errno 30] Read-only file system: "
            f"'{out / 'run.lock'}'"
        )
        assert counts(out) == before
        assert len(sim.simulator.chat_log()) == 10

        assert run_cli("run", str(job)).returncode == 0
    assert sorted(set(exported_ids(out))) == sorted(exported_ids(out))
    assert len(exported_ids(out)) == 30


@pytest.mark.slow
def test_readers_work_on_a_read_only_output_directory(tmp_path: Path) -> None:
    """`regen status`, `export --to`, `audit` and `report --to` only read state.db: a
    read-only directory (an archive, a shared mount) must not stop them. An export into it
    says where to write instead."""
    unshare = _unshare()
    write_rows(tmp_path / "chat.jsonl", chat_rows(12))
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=CHAT)
        assert run_cli("run", str(job)).returncode == 0
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    regen = f'"{sys.executable}" -m regen'
    commands = {
        "status": f'{regen} status "{out}" --json',
        "export": f'{regen} export "{out}" --to "{elsewhere}/export"',
        "audit": f'{regen} audit "{out}" --family kimi-k2.5 --json',
        "report": f'{regen} report "{out}" --to "{elsewhere}/report.html"',
        "export_here": f'{regen} export "{out}"',
    }
    script = f'mount --bind "{out}" "{out}" && mount -o remount,bind,ro "{out}"'
    for name, command in commands.items():
        log = f'"{tmp_path}/{name}.out"'
        script += f" && {{ {command} > {log} 2>&1; echo $? >> {log}; }}"
    ro = subprocess.run(
        [unshare, "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert ro.returncode == 0, ro.stdout + ro.stderr
    results = {n: (tmp_path / f"{n}.out").read_text().rsplit("\n", 2) for n in commands}
    for name in ("status", "export", "audit", "report"):
        text, code = results[name][0], results[name][1]
        assert code == "0", f"{name}: {text}"
    assert json.loads(results["status"][0])["datasets"][0]["done"] == 12
    ((whole,),) = query(out, "SELECT COUNT(*) FROM results WHERE finish_reason != 'length'")
    exported = (elsewhere / "export" / "train" / "chat.jsonl").read_text().splitlines()
    assert len(exported) == whole > 0
    text, code = results["export_here"][0], results["export_here"][1]
    assert code == "1" and text.strip().endswith("write it elsewhere with --to DIR"), text


def test_a_deleted_output_directory_stops_the_run_at_once(tmp_path: Path) -> None:
    """A connection to a deleted state.db writes on into nothing: the run notices at the next
    commit, stops sending, and says so in one line (it once sent all 2,011 requests)."""
    import sqlite3
    import time

    write_rows(tmp_path / "chat.jsonl", chat_rows(2000))
    out = tmp_path / "out"
    with sim_in_thread(SimConfig(seed=1, time_scale=0.05)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=CHAT, concurrency=16)
        proc = start_cli("run", str(job))

        def answers() -> int:
            try:
                db = sqlite3.connect(out / "state.db")
                try:
                    return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
                finally:
                    db.close()
            except sqlite3.Error:
                return 0

        deadline = time.monotonic() + 60
        while answers() < 20:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        shutil.rmtree(out)
        sent_at_delete = len(sim.simulator.chat_log())
        stdout, stderr = proc.communicate(timeout=60)
        sent = len(sim.simulator.chat_log())
    assert proc.returncode == 1, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "was deleted or replaced while this run was using it" in lines[0]
    assert sent - sent_at_delete <= 2 * 16 + 16  # what was in flight, and one commit's worth
    assert sent < 500


@pytest.mark.parametrize("damage", ["empty", "missing", "truncated"])
def test_a_past_job_whose_state_is_lost_is_refused_and_its_exports_kept(
    tmp_path: Path, damage: str
) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(30))
    out = tmp_path / "out"
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=CHAT)
        assert run_cli("run", str(job)).returncode == 0
        export = (out / "export" / "chat.jsonl").read_bytes()
        state = out / "state.db"
        for extra in ("state.db-wal", "state.db-shm"):
            (out / extra).unlink(missing_ok=True)
        if damage == "empty":
            state.write_bytes(b"")
        elif damage == "missing":
            state.unlink()
        else:
            data = state.read_bytes()
            state.write_bytes(data[: len(data) // 3])
        sent = len(sim.simulator.chat_log())
        again = run_cli("run", str(job))
        resent = len(sim.simulator.chat_log()) - sent
    assert again.returncode == 1 and resent == 0, again.stdout + again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in again.stderr, again.stderr
    expected = {
        "empty": "state.db is empty (0 bytes); regen will not start it over",
        "missing": "state.db is missing; regen will not start it over",
        "truncated": "the file is damaged: restore it from a backup",
    }[damage]
    assert expected in lines[0], lines[0]
    assert (out / "export" / "chat.jsonl").read_bytes() == export
