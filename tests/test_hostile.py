"""What a hostile server or a copied state.db can do to regen: no key written or printed, no
terminal escape printed, no file written outside its folder, no traceback on a damaged
state.db, and no leftovers of a killed export."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sqlite3
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from regen.safe import REDACTED, printable, redact, register_secret
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import (
    SECRET_KEY,
    chat_rows,
    free_port,
    run_cli,
    start_cli,
    write_job,
    write_rows,
)

ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\u202e"


@dataclass
class Echo:
    """What the echoing server saw, and the hook a test holds it with."""

    url: str = ""
    seen: list[str] = field(default_factory=list)
    """Every Authorization header it was sent."""
    held: threading.Event = field(default_factory=threading.Event)
    """Set once a request waits at the hold."""
    release: Any = None
    """Call to answer the held requests (with 401s) and every later one."""


@contextmanager
def echoing_server(answers: int = 8) -> Iterator[Echo]:
    """An OpenAI-compatible server that puts the caller's Authorization header (the key) into
    everything it says, with terminal escapes beside it: two 500s, a 400 for one prompt (that
    item fails with the message), `answers` answers (the key in the provider's name, the
    generation id and its header, the reasoning and the text), then it holds what comes next
    until released, and answers 401s that stop the run (the stop reason quotes the key)."""
    echo = Echo()
    calls = {"n": 0, "answered": 0}
    loop = asyncio.new_event_loop()
    gate = asyncio.Event()

    async def chat(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        auth = request.headers.get("Authorization", "")
        echo.seen.append(auth)
        calls["n"] += 1
        said = f"{auth} {ESCAPES}"
        if calls["n"] <= 2:
            return _error(500, f"upstream refused {said}")
        if "Question 3" in json.dumps(body):
            return _error(400, f"this prompt is refused for {said}")
        if calls["answered"] >= answers:
            echo.held.set()
            await gate.wait()
            return _error(401, f"invalid key {said}")
        calls["answered"] += 1
        gen = f"gen-{auth}-{calls['n']}"
        message = {"role": "assistant", "content": f"I saw {auth} here.", "reasoning": said}
        return web.json_response(
            {
                "id": gen,
                "provider": f"Echo {said}",
                "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
            },
            headers={"X-Generation-Id": gen, "X-Echo": auth},
        )

    async def anything(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

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
        echo.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        box["runner"] = runner
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    echo.release = lambda: loop.call_soon_threadsafe(gate.set)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield echo
    finally:
        echo.release()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def holding(out: Path, text: str) -> list[str]:
    """The files under `out` whose raw bytes hold `text` (state.db and its -wal and -shm,
    run.log, the report, every export and its card)."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    return [str(p.relative_to(out)) for p in files if text.encode() in p.read_bytes()]


@pytest.mark.slow
def test_a_key_a_server_echoes_leaves_regen_by_no_sink(tmp_path: Path) -> None:
    """The key a server echoes into every field it has (error messages that fail attempts,
    fail an item and stop the run, provider names, generation ids and headers, reasoning and
    answers) reaches none of regen's sinks: stdout and stderr, run.log, every byte of every
    file in the output directory (state.db with its -wal and -shm while the run is going and
    after it, report.html, each export format and its card) and a /metrics scrape taken while
    the run is going. The commands after the run are new processes that hold no key: what
    they print and write comes from state.db alone. Answers stay byte-exact but for the key."""
    write_rows(tmp_path / "chat.jsonl", chat_rows(30))
    port = free_port()
    with echoing_server(answers=8) as server:
        datasets = [("chat", "chat.jsonl", "openai")]
        job = write_job(tmp_path, server.url, datasets=datasets, concurrency=4)
        job.write_text(job.read_text().replace("[endpoint]", '[endpoint]\ndialect = "openai"'))
        out = tmp_path / "out"
        run = start_cli("run", str(job), "--metrics-port", str(port))
        try:
            assert server.held.wait(60), "the run never reached the hold"
            scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
            during = holding(out, SECRET_KEY)
            server.release()
            stdout, stderr = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert any(SECRET_KEY in auth for auth in server.seen)  # the server had the key to echo
    assert b"regen_answers_total" in scrape and SECRET_KEY.encode() not in scrape
    assert during == []
    assert run.returncode == 1, stdout + stderr
    assert f"the run stopped: auth: invalid key Bearer {REDACTED}" in stdout
    assert f"error: run stopped: auth: invalid key Bearer {REDACTED}" in stderr
    texts = [stdout, stderr]
    for fmt in ("specforge", "openai", "sharegpt", "tokenized"):
        family = ("--family", "qwen3") if fmt == "tokenized" else ()
        res = run_cli("export", str(out), "--format", fmt, *family, process=True)
        assert res.returncode == 0, res.stderr
        texts += [res.stdout, res.stderr]
    for args in (("status", str(out)), ("report", str(out))):
        res = run_cli(*args, process=True)
        assert res.returncode == 0, res.stderr
        texts += [res.stdout, res.stderr]
    for text in texts:
        assert SECRET_KEY not in text
        assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    assert holding(out, SECRET_KEY) == []
    assert REDACTED.encode() in (out / "state.db").read_bytes()
    assert REDACTED in (out / "report.html").read_text()
    assert REDACTED in (out / "export" / "openai" / "README.md").read_text()  # providers
    import pyarrow.parquet as pq

    (shard,) = (out / "export" / "tokenized").rglob("*.parquet")  # compressed: read it too
    rows = json.dumps(pq.read_table(shard).drop(["input_ids", "loss_mask"]).to_pylist())
    assert SECRET_KEY not in rows and REDACTED in rows  # provenance: provider, generation id
    answers = [json.loads(x) for x in (out / "export" / "chat.jsonl").read_text().splitlines()]
    assert len(answers) == 8 and all(
        a["conversations"][-1]["content"] == f"I saw Bearer {REDACTED} here." for a in answers
    )
    log = (out / "run.log").read_text()
    assert "\x1b" not in log and "\r" not in log


def test_metrics_take_a_key_out_of_every_label_value() -> None:
    """/metrics has one way out (view.metrics._scrape): a label value that holds a key (here an
    endpoint's name, which a job file may spell any way) is redacted, as any text would be."""
    from regen.view.metrics import exposition
    from tests.view.test_metrics import fake_stats

    key = "sk-unit-metrics-key-0042"
    register_secret(key)
    stats = fake_stats()
    stats.endpoints[f"ep-{key}"] = stats.endpoints.pop("upstream")
    text = exposition(stats)
    assert key not in text
    assert f'endpoint="ep-{REDACTED}"' in text


def test_the_console_redacts_and_escapes_before_it_folds_a_line() -> None:
    """rich folds a long word across lines, where a stream's redaction would no longer find
    the key: every command's console takes it out, and shows escapes, before the layout."""
    from regen.view.console import KeyFreeConsole

    key = "sk-unit-console-key-" + "9" * 60
    register_secret(key)
    buf = io.StringIO()
    KeyFreeConsole(file=buf, width=30).print(f"stopped: {key}\x1b]0;owned\x07 and more")
    shown = buf.getvalue()
    assert "console-key" not in shown and "99999" not in shown
    assert "[redacted" in shown  # REDACTED, perhaps folded at its space
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;owned" in shown


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
