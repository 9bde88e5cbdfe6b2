"""The README under test: its job files and its `regen ...` lines, run as a user would follow
them, against the simulator (started with the README's own `regen sim` lines), on small local
fixtures in the documented formats.

What cannot run here is changed by named substitutions, each of which must apply exactly once
(a README edit that moves it fails the test instead of skipping it): the sim's real port for
the README's (and the sim at full speed), the hub dataset for a local file.
Each test runs every line of the shell blocks it takes, and every shell block with a `regen`
line is taken by one of them."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from tests.conftest import run_cli

README = Path(__file__).resolve().parents[1] / "README.md"
FIXTURES = Path(__file__).parent / "sources" / "fixtures"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
REGEN = ".venv/bin/regen"
TAKEN = ("--pilot", "regen sim --port", "regen providers", "for port in", "regen run qwen3-fleet")
"""What marks each shell block a test below runs in full."""


def blocks(lang: str) -> list[str]:
    return [m[2] for m in FENCE.finditer(README.read_text()) if m[1] == lang]


def block_with(lang: str, marker: str) -> str:
    found = [b for b in blocks(lang) if marker in b]
    assert len(found) == 1, f"README.md: expected one ```{lang} block with {marker!r}"
    return found[0]


def lines(block: str) -> list[str]:
    """Shell lines with continuations joined; comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    return [
        ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")
    ]


def substitute(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"README.md: expected {old!r} once in the block"
    return text.replace(old, new)


class Shell:
    """Runs README lines in `cwd`: `export`s, `VAR=value` prefixes, `regen ...` in this process
    (in the background for `regen sim ... &`, as a process), nothing else."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env: dict[str, str] = {}
        self.ports: dict[str, str] = {}
        """README port -> the port the sim started for it listens on."""
        self.procs: list[subprocess.Popen[str]] = []

    def run(self, line: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        words = shlex.split(line, comments=True)
        env = dict(self.env)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[:1] == ["export"]:
            key, _, value = words[1].partition("=")
            self.env[key] = value
            return subprocess.CompletedProcess(words, 0, "", "")
        assert words[:1] == [REGEN], f"README.md: not a regen line: {line}"
        args = words[1:]
        if args[-1] == "&":
            return self._background(args[:-1], env)
        if "--watch" in args:
            return self._watch(args, env)
        res = run_cli(*args, env=env)
        assert res.returncode == expect, f"{line}\n{res.stdout}\n{res.stderr}"
        return res

    def _background(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        assert args[0] == "sim", f"README.md: only `regen sim` runs in the background: {args}"
        i = args.index("--port") + 1
        readme_port, args[i] = args[i], "0"  # any free port; its address is printed
        # At full speed: the simulated latencies would only make the test wait.
        fast = self.cwd / "fast-sim.toml"
        fast.write_text("time_scale = 0.0\n")
        args += ["--config", str(fast)]
        proc = self._start(args, env)
        self.procs.append(proc)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("regen sim listening on http://127.0.0.1:"), first
        self.ports[readme_port] = first.split("127.0.0.1:")[1].split("/")[0]
        return subprocess.CompletedProcess(args, 0, first, "")

    def _watch(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """`regen status --watch` until its first view, then Ctrl-C, as a user leaves it."""
        proc = self._start(args, env)
        assert proc.stdout is not None
        view = ""
        while not view.rstrip().endswith("┘"):  # the view ends with its last table
            line = proc.stdout.readline()
            assert line, f"{args}: ended before its first view: {view}"
            view += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{args}: {proc.returncode}\n{err}"
        return subprocess.CompletedProcess(args, 0, view + out, err)

    def _start(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "regen", *args],
            cwd=self.cwd,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.communicate(timeout=30)


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    monkeypatch.chdir(tmp_path)  # the README's paths are relative to where the user stands
    sh = Shell(tmp_path)
    try:
        yield sh
    finally:
        sh.close()


def chat_fixture(path: Path, n: int) -> None:
    """`format = "openai"`: one row per line with `messages`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"messages": [{"role": "user", "content": f"Explain idea {i} briefly."}]} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rehearsal_edit(shell: Shell) -> str:
    """The README's rehearsal: start `regen sim` as shown, and the job-file line it says to add,
    with the port the sim got."""
    block = block_with("sh", "regen sim --port")
    sim_line, edit, run_line = block.strip().splitlines()
    shell.run(sim_line)
    m = re.fullmatch(
        r'# in job\.toml: \[endpoint\] (base_url = "http://127\.0\.0\.1:(\d+)/api/v1")', edit
    )
    assert m, f"README.md: the rehearsal's job-file edit changed: {edit}"
    return m[1].replace(m[2], shell.ports[m[2]]), run_line


def test_the_quick_start_runs_as_written_with_its_lanes(shell: Shell, tmp_path: Path) -> None:
    job = block_with("toml", 'name = "kimi-chat"')
    chat_fixture(tmp_path / "data" / "chat.jsonl", 40)
    base_url, rehearse = rehearsal_edit(shell)
    (tmp_path / "job.toml").write_text(f"[endpoint]\n{base_url}\n\n{job}")
    run = []
    for line in lines(block_with("sh", "--pilot")):
        run.append(shell.run(line))
    plan, first = run[1], run[2]
    assert "chat" in plan.stdout
    # The start line has the shape the README shows (the pilot's answers were kept).
    shown = [ln for ln in block_with("", "resuming from").splitlines() if "resuming" in ln][0]
    shape = re.escape(shown.split(":")[0]) + r": resuming from \d+ of \d+"
    assert re.search(shape, first.stdout), first.stdout
    assert "spend since the job started: ledger $" in first.stdout
    export = (tmp_path / "out" / "kimi-chat" / "export" / "chat.jsonl").read_text().splitlines()
    assert len(export) == 40
    again = shell.run(rehearse)  # the rehearsal's own run line: nothing left to send
    assert "dataset chat: complete" in again.stdout
    # The two lanes, added to the same job, run it too (short answers cut at 10240 escalate).
    lanes = block_with("toml", "[[lanes]]")
    (tmp_path / "lanes.toml").write_text((tmp_path / "job.toml").read_text() + "\n" + lanes)
    res = run_cli("run", "lanes.toml", "--out", "out/lanes", env=shell.env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "lane short" in res.stdout or "short" in res.stdout


def test_the_eight_dataset_job_and_every_command_after_it(shell: Shell, tmp_path: Path) -> None:
    job = block_with("toml", 'output_dir = "out/kimi-eight"')
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(FIXTURES / "b1_glaive.json", data / "glaive-function-calling-v2.json")
    shutil.copy(FIXTURES / "b4_mixture_of_thoughts.jsonl", data / "mixture-of-thoughts.jsonl")
    swe = data / "swe-agent-trajectories"
    swe.mkdir()
    _parquet(FIXTURES / "b8_swe_nebius.jsonl", swe / "part-00000.parquet")
    # The model's tokenizer files, as the job names them: the simulator's vocabulary with the
    # Kimi-K2.5 chat template the simulator bills with.
    from regen.reconstruct import sim_template

    tok = tmp_path / "models" / "Kimi-K2.5"
    shutil.copytree(str(resources.files("regen.sim").joinpath("tokenizer")), tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["chat_template"] = sim_template("kimi-k2.5")
    (tok / "tokenizer_config.json").write_text(json.dumps(config))

    base_url, _ = rehearsal_edit(shell)
    job = substitute(job, "[endpoint]\n", f"[endpoint]\n{base_url}\n")
    job = substitute(job, "hf://open-r1/Mixture-of-Thoughts", "data/mixture-of-thoughts.jsonl")
    (tmp_path / "job.toml").write_text(job)
    shell.env["OPENROUTER_API_KEY"] = "sk-or-test"

    commands = lines(block_with("sh", "regen providers"))
    providers, inspect = shell.run(commands[0]), shell.run(commands[1])
    assert "deepinfra/nvfp4" in providers.stdout
    assert "B1-glaive" in inspect.stdout or "row" in inspect.stdout
    res = run_cli("run", "job.toml", env=shell.env)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("B1-glaive", "B4-mot", "B8-swe"):
        assert f"dataset {name}:" in res.stdout
    status = shell.run(commands[2])
    assert "B8-swe" in status.stdout
    for line in commands[3:]:
        shell.run(line)
    out = tmp_path / "out" / "kimi-eight" / "export"
    manifest = json.loads((out / "specforge" / "manifest.json").read_text())
    assert set(manifest["datasets"]) == {"B1-glaive", "B4-mot", "B8-swe"}
    tokenized = json.loads((out / "tokenized" / "manifest.json").read_text())
    assert sum(sum(d["samples"].values()) for d in tokenized["datasets"].values()) > 0


def _parquet(jsonl: Path, to: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(ln) for ln in jsonl.read_text().splitlines() if ln.strip()]
    pq.write_table(pa.Table.from_pylist(rows), to)


def test_the_fleet_quick_start_on_two_simulated_vllm_servers(shell: Shell, tmp_path: Path) -> None:
    job = block_with("toml", 'name = "qwen3-fleet"')
    loop = block_with("sh", "for port in")
    m = re.search(r"for port in ([\d ]+); do\s*\n\s*(.+?)\s*\n\s*done", loop)
    assert m, "README.md: the fleet rehearsal's loop changed"
    for port in m[1].split():
        shell.run(m[2].replace("$port", port))
    edits = [ln for ln in loop.splitlines() if ln.startswith("#")]
    urls = re.findall(r'"http://127\.0\.0\.1:(\d+)/v1"', edits[0])
    assert sorted(urls) == sorted(shell.ports), edits[0]
    for url_port, gpu in zip(urls, ("10.0.0.10", "10.0.0.11"), strict=True):
        job = substitute(
            job, f'"http://{gpu}:8001/v1"', f'"http://127.0.0.1:{shell.ports[url_port]}/v1"'
        )
    assert 'tokenizer = "sim"' in edits[1]
    job = substitute(job, 'tokenizer = "Qwen/Qwen3-8B"', 'tokenizer = "sim"')
    (tmp_path / "qwen3-fleet.toml").write_text(job)
    chat_fixture(tmp_path / "data" / "chat.jsonl", 24)
    run, audit, export = (shell.run(ln) for ln in lines(block_with("sh", "regen run qwen3-fleet")))
    assert "dataset chat:" in run.stdout
    assert "the rebuild equals the server's ids in 100.0%" in audit.stdout, audit.stdout
    manifest = json.loads(
        (tmp_path / "out" / "qwen3-fleet" / "export" / "tokenized" / "manifest.json").read_text()
    )
    ids = {k for d in manifest["datasets"].values() for k in d["ids"]}
    assert ids == {"exact"}, manifest


def test_every_shell_block_with_a_regen_line_is_run_above() -> None:
    with_regen = [b for b in blocks("sh") if REGEN in b]
    untaken = [b for b in with_regen if not any(marker in b for marker in TAKEN)]
    assert not untaken, f"README.md: shell blocks no test runs: {untaken}"
    assert len(with_regen) == len(TAKEN)
