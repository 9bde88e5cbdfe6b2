"""Shared fixtures: a real simulator on 127.0.0.1, job files in tmp dirs, the CLI as a process."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from regen.conversation import Conversation
from regen.sim import RunningSim, SimConfig, sim_in_thread

# `datasets` caches what it loads under keys of the files' paths: a cache shared across runs can
# serve a reused tmp path's stale rows. Each test process gets its own, removed at its end.
_HF_CACHE = tempfile.mkdtemp(prefix="regen-tests-hf-datasets-")
os.environ["HF_DATASETS_CACHE"] = _HF_CACHE
atexit.register(shutil.rmtree, _HF_CACHE, True)

# Property tests draw the same examples on every run (CI and here): a failure reproduces.
# scripts/fuzz.py runs the hostile-input ones longer, with fresh examples (REGEN_FUZZ_SCALE).
FUZZ_SCALE = float(os.environ.get("REGEN_FUZZ_SCALE", "0") or 0)
settings.register_profile("regen", derandomize=True)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
settings.load_profile("fuzz" if FUZZ_SCALE else "regen")


def fuzz_examples(n: int) -> int:
    """A property test's examples: `n` in the suite, `n` x REGEN_FUZZ_SCALE in a fuzz run."""
    return max(1, int(n * FUZZ_SCALE)) if FUZZ_SCALE else n


SECRET_KEY = "sk-or-v1-test-SECRET-7f3a9c"


@pytest.fixture
def sim() -> Iterator[RunningSim]:
    """A simulator that answers at once (time_scale 0), seeded."""
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as running:
        yield running


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a query on `<out>/state.db`, read as a user would, with its own connection."""
    db = sqlite3.connect(out / "state.db")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (for a process that binds it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    condition: Callable[[], object],
    what: str = "the condition",
    limit_s: float = 120.0,
    process: subprocess.Popen[Any] | None = None,
) -> None:
    """Poll `condition()` until it holds: a state another process reaches (a row in its
    state.db, a line in its log). Fails naming `what` if `process` ends first or the limit
    (a bound on a hang, not a timing the test relies on) passes."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert process is None or process.poll() is None, f"the process ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {limit_s:g} s"
        time.sleep(0.02)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat_rows(n: int, prefix: str = "Question") -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"{prefix} number {i}: explain step {i}."},
                {"role": "assistant", "content": f"original answer {i}"},
            ]
        }
        for i in range(n)
    ]


def refusing_sim(capacity: int, seed: int) -> SimConfig:
    """The simulator (time scale 0.02) with its one endpoint answering `capacity` requests
    at once and refusing the rest (429, Retry-After 0.05 s)."""
    cfg = SimConfig(seed=seed, time_scale=0.02, retry_after_s=0.05)
    model = cfg.models[0]
    endpoint = model.endpoints[0].model_copy(update={"capacity": capacity})
    return cfg.model_copy(update={"models": [model.model_copy(update={"endpoints": [endpoint]})]})


def two_lanes(long_max_tokens: int) -> str:
    """Job lanes `short` (8 at once, max_tokens 256, truncated answers escalated) and `long`
    (4 at once, `long_max_tokens`)."""
    return f"""
[[lanes]]
name = "short"
concurrency = 8
max_tokens = 256
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 4
max_tokens = {long_max_tokens}
"""


def write_job(
    tmp: Path,
    base_url: str,
    *,
    datasets: list[tuple[str, str, str]] | None = None,
    extra: str = "",
    concurrency: int = 16,
    rows: int = 20,
) -> Path:
    """A job file in `tmp` whose output goes to `tmp/out`; datasets are (name, path, format),
    else one, `chat`, of `rows` chat rows. `extra` goes into [run] (and may open sections
    after it); add_to_section changes another section."""
    if datasets is None:
        write_rows(tmp / "chat.jsonl", chat_rows(rows))
        datasets = [("chat", "chat.jsonl", "openai")]
    blocks = "".join(
        f'\n[[datasets]]\nname = "{n}"\npath = "{p}"\nformat = "{f}"\n' for n, p, f in datasets
    )
    job = tmp / "job.toml"
    job.write_text(
        f"""
[job]
name = "test"
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "REGEN_TEST_KEY"

[generation]
model = "moonshotai/kimi-k2.5"
max_tokens = 512
temperature = 0.7

[run]
concurrency = {concurrency}
progress_interval_s = 0.5
{extra}
{blocks}
"""
    )
    return job


def kill_at(job: Path, point: str, times: int, env: dict[str, str] | None = None) -> int:
    """Run `regen run JOB` `times` times as a process, each killed with SIGKILL at `point`
    (REGEN_CRASH_AT) and run again at once: how many kills landed."""
    full = {**os.environ, "REGEN_TEST_KEY": SECRET_KEY, **(env or {}), "REGEN_CRASH_AT": point}
    kills = 0
    for _ in range(times):
        proc = subprocess.run(
            [sys.executable, "-m", "regen", "run", str(job)],
            env=full,
            capture_output=True,
            timeout=120,
        )
        kills += proc.returncode == -signal.SIGKILL
    return kills


def add_to_section(job: Path, section: str, lines: str) -> Path:
    """`lines` added to the job file's `[section]`, under its header: how a test changes a
    section of a job file write_job made (its [endpoint], its [run] after the fact)."""
    text = job.read_text()
    header = f"\n[{section}]\n"
    assert header in text, f"{job} has no [{section}]"
    job.write_text(text.replace(header, f"{header}{lines}\n", 1))
    return job


def roles(conversation: Conversation) -> list[str]:
    """The roles of a conversation's messages, in order."""
    return [m.role for m in conversation.messages]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """`regen ARGS` with the test key in the environment, as `python -m regen` would run it.

    In this process by default: the same `main()`, stdout and stderr, exit code and files, without
    the second of imports each new interpreter pays. `process=True` for what only a process
    shows: signals, kill -9, another process's lock."""
    full_env = {**os.environ, "REGEN_TEST_KEY": SECRET_KEY, **(env or {})}
    if process:
        return subprocess.run(
            [sys.executable, "-m", "regen", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )
    return _in_process(list(args), full_env)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`regen ARGS` started as a process (text pipes, the test key set), for tests that signal,
    kill or watch it while it runs."""
    return subprocess.Popen(
        [sys.executable, "-m", "regen", *args],
        env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    from regen.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["regen", *args], code, out.getvalue(), err.getvalue())
