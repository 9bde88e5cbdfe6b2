"""What a hostile server or a copied state.db can do to regen: no key written or printed, no
terminal escape printed, no file written outside its folder, no traceback on a damaged
state.db, and no leftovers of a killed export."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from regen.safe import REDACTED, printable, redact, register_secret
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import SECRET_KEY, chat_rows, run_cli, write_job, write_rows

ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\u202e"


@contextmanager
def echoing_server() -> Iterator[str]:
    """An OpenAI-compatible server that puts the caller's Authorization header into everything
    it says: error bodies (three 500s), the provider's name and the answer itself, with
    terminal escapes beside it."""
    calls = {"n": 0}

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        auth = request.headers.get("Authorization", "")
        calls["n"] += 1
        if calls["n"] <= 3:
            body = {"error": {"message": f"upstream refused {auth} {ESCAPES}", "code": 500}}
            return web.json_response(body, status=500)
        return web.json_response(
            {
                "id": f"gen-{calls['n']}",
                "provider": f"Echo {auth}{ESCAPES}",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"I saw {auth} here."},
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
            }
        )

    async def anything(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_route("GET", "/{tail:.*}", anything)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        box["runner"] = runner
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield box["url"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def every_byte(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


def test_a_key_a_server_echoes_is_never_stored_printed_or_exported(tmp_path: Path) -> None:
    with echoing_server() as url:
        job = write_job(tmp_path, url, datasets=None)
        job.write_text(job.read_text().replace("[endpoint]", '[endpoint]\ndialect = "openai"'))
        res = run_cli("run", str(job))
    out = tmp_path / "out"
    assert res.returncode in (0, 3), res.stdout + res.stderr
    assert (out / "export" / "chat.jsonl").exists()
    res2 = run_cli("export", str(out), "--format", "openai")
    assert res2.returncode == 0, res2.stderr
    status = run_cli("status", str(out))
    for text in (res.stdout, res.stderr, res2.stdout, status.stdout, status.stderr):
        assert SECRET_KEY not in text
        assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    blob = every_byte(out)
    assert SECRET_KEY.encode() not in blob  # state.db, its WAL, run.log, report, exports
    assert REDACTED.encode() in blob
    answers = [json.loads(x) for x in (out / "export" / "chat.jsonl").read_text().splitlines()]
    assert answers and all(
        a["conversations"][-1]["content"] == f"I saw Bearer {REDACTED} here." for a in answers
    )
    log = (out / "run.log").read_text()
    assert "\x1b" not in log and "\r" not in log


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    register_secret("sk-unit-test-secret-123")
    shown = printable("a\x1b[2Jb\x07c\rd\u202ee\nf sk-unit-test-secret-123\t")
    assert shown == f"a\\x1b[2Jb\\x07c\\x0dd\\u202ee\\nf {REDACTED}\t"  # a tab is harmless
    assert printable("line\nbreak", newlines=True) == "line\nbreak"
    assert redact("no keys here") == "no keys here"


def test_a_state_db_that_names_a_dataset_outside_the_folder_is_refused(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        assert run_cli("run", str(job)).returncode == 0
    out = tmp_path / "out"
    evil = "../../../../" + str(tmp_path / "escaped").lstrip("/")
    db = sqlite3.connect(out / "state.db")
    for table in ("datasets",):
        db.execute(f"UPDATE {table} SET name = ?", (evil,))
    for table in ("items", "results", "conversations", "ledger"):
        db.execute(f"UPDATE {table} SET dataset = ?", (evil,))
    db.commit()
    db.close()
    for fmt in ("specforge", "tokenized"):
        res = run_cli("export", str(out), "--format", fmt, "--family", "kimi-k2.5")
        assert res.returncode != 0
        (line,) = res.stderr.strip().splitlines()
        assert "not a name a job file allows" in line, line
    assert not list(tmp_path.glob("escaped*")) and not (tmp_path / "escaped").exists()
    assert not list(Path("/tmp").glob(f"{(tmp_path / 'escaped').name}*"))


def test_a_state_db_damaged_in_the_middle_is_one_line_from_every_command(tmp_path: Path) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(400))  # a state.db of some 100 pages
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        assert run_cli("run", str(job)).returncode == 0
    out = tmp_path / "out"
    db = out / "state.db"
    data = bytearray(db.read_bytes())
    page = 4096
    # The middle third of the file turned to garbage (damage near the start was caught).
    pages = len(data) // page
    for n in range(pages // 3, 2 * pages // 3):
        data[n * page : (n + 1) * page] = b"\xa5" * page
    db.write_bytes(bytes(data))
    for wal in out.glob("state.db-*"):
        wal.unlink()
    commands = [("run", str(job)), ("export", str(out)), ("status", str(out))]
    family = ("--family", "kimi-k2.5")
    commands += [
        ("audit", str(out), *family),
        ("export", str(out), "--format", "tokenized", *family),
    ]
    for args in commands:
        res = run_cli(*args)
        assert res.returncode != 0, args
        assert "Traceback" not in res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("error: ") and "damaged" in line, line


def test_export_removes_what_a_killed_export_left(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        assert run_cli("run", str(job)).returncode == 0
    out = tmp_path / "out"
    to = tmp_path / "ex" / "sf"
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    left = to.parent / f".sf.tmp-{dead}"
    (left / "train").mkdir(parents=True)
    (left / "train" / "chat.jsonl").write_text("{}\n")
    other = to.parent / f".other.tmp-{dead}"  # another export's: not this one's to clean
    other.mkdir()
    res = run_cli("export", str(out), "--to", str(to))
    assert res.returncode == 0, res.stderr
    assert not left.exists() and other.exists()
    shutil.rmtree(other)


def test_every_command_refuses_a_state_db_of_a_newer_regen_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """A newer regen may have added tables or columns this one would not keep: every command
    refuses its state.db with one line (the file, its schema and this regen's), and nothing is
    written to it."""
    from regen.state.schema import MIGRATIONS

    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        assert run_cli("run", str(job)).returncode == 0
        write_rows(tmp_path / "chat.jsonl", chat_rows(30))  # items a run would send
        out = tmp_path / "out"
        newer = len(MIGRATIONS) + 1
        db = sqlite3.connect(out / "state.db")
        db.execute("INSERT INTO schema_migrations VALUES (?, 'm_from_the_future', 0)", (newer,))
        db.commit()
        db.close()
        state = out / "state.db"
        before = (state.read_bytes(), state.stat().st_mtime_ns)
        sent = len(sim.simulator.chat_log())
        family = ("--family", "kimi-k2.5")
        commands = [
            ("run", str(job)),
            ("plan", str(job)),
            ("status", str(out)),
            ("export", str(out)),
            ("export", str(out), "--format", "tokenized", *family),
            ("audit", str(out), *family),
            ("report", str(out)),
        ]
        for args in commands:
            res = run_cli(*args)
            assert res.returncode == 1, (args, res.stdout, res.stderr)
            (line,) = res.stderr.strip().splitlines()
            assert line.startswith(f"error: {state}: its schema is version {newer}, "), line
            assert f"knows versions up to {len(MIGRATIONS)}" in line, line
            assert "use the regen that wrote it" in line, line
            assert (state.read_bytes(), state.stat().st_mtime_ns) == before, args
        assert len(sim.simulator.chat_log()) == sent  # the run and the plan sent nothing
