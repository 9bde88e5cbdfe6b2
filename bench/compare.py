"""regen against its peers on one workload, side by side (issues 12 and 23).

The same prompts (heterogeneous lengths), the same simulated provider (a concurrency capacity,
429 with Retry-After above it, faults at about one request in a hundred), the same number of
requests in flight, run by:

- `regen`: `regen run job.toml` (one lane; adaptive limit; retries; state.db; export).
- every peer that installs from PyPI, each in its own virtual environment that this script
  makes from pinned versions (`PEERS`; cached under `--venv-root` between runs), each written
  the way its documentation shows, its defaults kept and its own resume used
  (bench/peers/*.py say how):
  - `openai-async`: `openai.AsyncOpenAI` behind an `asyncio.Semaphore` (the naive baseline);
  - `threadpool`: SpecForge's `regenerate_train_data.py` pattern (`ThreadPoolExecutor`);
  - `litellm`: `litellm.acompletion` behind an `asyncio.Semaphore`, offline;
  - `curator`: bespokelabs-curator's `curator.LLM` on its OpenAI backend, offline;
  - `distilabel`: a `Pipeline` of `LoadDataFromDicts` >> `ChatGeneration(OpenAILLM)`.

Each runner is its own process group pinned to core 1 (the simulator, started afresh for every
run, is pinned to core 0), alternated within each round. Per runner and round:

1. a full run: wall time, answers per second, client CPU seconds per 1,000 rows (user + system
   of the runner and the children it waited for, from wait4), peak RSS (the larger of wait4's
   and the sampled sum over the process group), requests answered 429, rows missing, answers
   paid twice (the simulator's bill: billed answers less distinct ones); then, while rows are
   missing, the runner again with its own resume (as a user would; same simulator) until none
   are missing or a pass answers no new row: passes, *time to every row answered* (the
   passes' wall times, each from its process start), rows still missing, answers paid twice;
2. a kill and restart: SIGKILL to the process group once `--kill-at` of the rows are billed,
   then the peer's own resume: rows missing, rows written twice, answers paid twice;
3. a dollar cap of `--cap-fraction` of the full run's spend: regen runs with
   `[budget] max_cost_usd`; no peer has a cap, so their spend is the full run's.

    .venv/bin/python bench/compare.py setup                 # make the peers' environments
    .venv/bin/python bench/compare.py [--requests 3000] [--rounds 3] [--lock /tmp/bench.lock]
    .venv/bin/python bench/compare.py report --results FILE  # the tables again, from a log
    .venv/bin/python bench/compare.py tail --keep DIR   # how regen's kept full runs ended
    .venv/bin/python bench/compare.py scale [--requests 100000]   # regen at 2,000 and 10,000

The default workload is issue 23's: 3,000 prompts, 512 in flight, capacity 400, ~1% faults.
`--lock PATH` holds an exclusive flock on PATH around each measured run and each install, so
runs of other benchmarks on the machine never overlap a measurement. `--keep DIR` keeps each
run's folder (state.db, run.log, outputs, bench.json with each pass's start and wall time)
under DIR and ends with regen's tail (`tail`); without it, a run's folder is removed once
measured. Logs written before the time to every row answered still report (without it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import simproc

HERE = Path(__file__).resolve()
PEER_DIR = HERE.parent / "peers"
KEY = "sk-bench-not-a-secret"
MODEL = "bench/model"

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
"""tiktoken looks for a cached vocabulary under the sha1 of the URL it would fetch it from."""


@dataclass(frozen=True)
class Peer:
    """A runner from PyPI: its script in bench/peers/, its environment, its offline settings."""

    script: str
    venv: str
    env: dict[str, str] = field(default_factory=dict)
    cl100k: bool = False
    """Point TIKTOKEN_CACHE_DIR at the cl100k_base copy litellm ships (curator needs it)."""


VENVS: dict[str, tuple[str, ...]] = {
    "openai": ("openai==3.60.0",),
    "litellm": ("litellm==1.110.2",),
    # curator pins its own litellm (1.83.7 in this release).
    "curator": ("bespokelabs-curator==0.1.31",),
    # distilabel 1.5.3 imports requests (pipeline/_dag.py) without requiring it.
    "distilabel": ("distilabel[openai]==1.5.3", "openai==3.60.0", "requests==2.34.2"),
}
"""Each environment's pinned requirements (its name is also the folder's prefix)."""

OFFLINE_HF = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

PEERS: dict[str, Peer] = {
    "openai-async": Peer("openai_async.py", "openai"),
    "threadpool": Peer("threadpool.py", "openai"),
    "litellm": Peer("litellm_async.py", "litellm", {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}),
    "curator": Peer(
        "curator_llm.py",
        "curator",
        {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "TELEMETRY_ENABLED": "false", **OFFLINE_HF},
        cl100k=True,
    ),
    "distilabel": Peer("distilabel_pipeline.py", "distilabel", OFFLINE_HF),
}
RUNNERS = ("regen", *PEERS)

TTFT_S, TOKENS_PER_S, MAX_TOKENS = 0.4, 80, 2048
"""The simulated endpoint's speed and the answers' cap: an answer takes at most
(TTFT_S + MAX_TOKENS / TOKENS_PER_S) * time scale, unless a stall holds it."""

SIM = """
seed = {seed}
time_scale = {time_scale}
retry_after_s = 1.0
{faults}
[[models]]
id = "{model}"
mean_completion_tokens = {mean}
reasoning = false

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
prompt_price = 5e-7
completion_price = 2e-6
ttft_s = {ttft_s}
tokens_per_s = {tokens_per_s}
capacity = {capacity}
"""

FAULTS = """
[faults]
http_5xx = 0.005
http_408 = 0.001
reset = 0.002
error_200 = 0.002
midstream_error = 0.002
stall = 0.0005
stall_s = 10.0
"""
"""About one request in a hundred meets a fault: 5xx, 408, a cut connection, an error in a 200
body or mid-answer, a stall."""

JOB = """
[job]
output_dir = "out"

[endpoint]
base_url = "{url}"
api_key_env = "BENCH_KEY"

[generation]
model = "{model}"
max_tokens = {max_tokens}

[run]
progress_interval_s = 5
stop_grace_s = 30
{budget}
[[lanes]]
name = "main"
concurrency = {concurrency}

[[datasets]]
name = "d"
path = "prompts.jsonl"
"""

WORDS = ["the", "of", "data", "model", "token", "explain", "code", "step", "write", "prove", "how"]


def write_prompts(path: Path, n: int) -> None:
    """Prompts from a few words to a few hundred; some ask for long answers."""
    rng = random.Random(7)
    with path.open("w") as f:
        for i in range(n):
            k = min(400, int(rng.lognormvariate(3.0, 1.0)) + 3)
            text = " ".join(rng.choices(WORDS, k=k))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i}: {text}"}]}) + "\n")


# environments --------------------------------------------------------------------------------


@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    """An exclusive flock on `lock` (if given) for the duration."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def venv_dir(root: Path, name: str) -> Path:
    pins = VENVS[name]
    return root / f"{name}-{hashlib.sha1(' '.join(pins).encode()).hexdigest()[:8]}"


def ensure_venv(root: Path, name: str, lock: str | None) -> Path:
    """The environment `name` with its pinned requirements, made once and kept (a folder
    named by the pins' hash; `pins.txt` is written last, so a broken install is redone)."""
    d = venv_dir(root, name)
    if (d / "pins.txt").exists():
        return d
    with held(lock):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(d)], check=True)
        subprocess.run(
            [str(d / "bin/python"), "-m", "pip", "install", "-q", *VENVS[name]], check=True
        )
        freeze = subprocess.run(
            [str(d / "bin/python"), "-m", "pip", "freeze"], check=True, capture_output=True
        )
    (d / "freeze.txt").write_bytes(freeze.stdout)
    (d / "pins.txt").write_text("\n".join(VENVS[name]) + "\n")
    return d


def installed(d: Path, package: str) -> str:
    """The version of `package` in the environment's `pip freeze`, or '?'."""
    for line in (d / "freeze.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.lower().replace("_", "-") == package:
            return version
    return "?"


def cl100k_dir(d: Path) -> str:
    """litellm's bundled tokenizers folder, which holds cl100k_base under tiktoken's name."""
    blob = hashlib.sha1(CL100K_URL.encode()).hexdigest()
    for found in d.glob(f"lib/python*/site-packages/litellm/litellm_core_utils/tokenizers/{blob}"):
        return str(found.parent)
    raise SystemExit(f"no cl100k_base copy ({blob}) in {d}'s litellm")


# processes -----------------------------------------------------------------------------------


def spawn(args: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Start a client in its own process group pinned to core 1; its output goes to files in
    cwd."""
    env = {**os.environ, "BENCH_KEY": KEY, **env}
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.chdir(cwd)
            out = os.open("stdout.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            err = os.open("stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.execvpe("taskset", ["taskset", "-c", "1", *args], env)
        finally:
            os._exit(127)
    return pid


PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def group_rss_mb(pgid: int) -> float:
    """The summed RSS of the processes in a process group (a peer may run several)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # fields[0] is the state, field 3
        if int(fields[2]) == pgid:  # field 5, pgrp
            total += int(fields[21])  # field 24, rss in pages
    return total * PAGE_MB


@dataclass
class Child:
    """A runner's process group, watched until it ends."""

    pid: int
    rss_mb: float = 0.0
    sampled: float = 0.0

    def poll(self) -> tuple[int, float, float] | None:
        """(exit code, CPU seconds, peak RSS MB) once it has ended, else None."""
        pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            if time.monotonic() - self.sampled > 0.5:  # a /proc scan costs a few ms
                self.rss_mb = max(self.rss_mb, group_rss_mb(self.pid))
                self.sampled = time.monotonic()
            return None
        with contextlib.suppress(ProcessLookupError):  # children it left behind
            os.killpg(self.pid, signal.SIGKILL)
        return (
            os.waitstatus_to_exitcode(status),
            usage.ru_utime + usage.ru_stime,
            max(self.rss_mb, usage.ru_maxrss / 1024),
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)


def reap(pid: int) -> tuple[int, float, float]:
    """(exit code, CPU seconds, peak RSS MB) of a child, waiting for it."""
    child = Child(pid)
    while (done := child.poll()) is None:
        time.sleep(0.05)
    return done


def sim_stats(url: str, settle: bool = True) -> dict[str, Any]:
    """What the simulator served and billed, once the generations a killed runner left behind
    have ended (the simulator bills an answer when its generation ends)."""
    base = url.rsplit("/api/v1", 1)[0]
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"{base}/_sim/stats", timeout=10) as r:
            data: dict[str, Any] = json.loads(r.read())
        if not settle or not data.get("unbilled") or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def command(kind: str, url: str, concurrency: int, root: Path) -> tuple[list[str], Path | None]:
    """The runner's command line and its environment's folder (None: this interpreter)."""
    if kind == "regen":
        return [sys.executable, "-m", "regen", "run", "job.toml"], None
    peer = PEERS[kind]
    d = venv_dir(root, peer.venv)
    return [str(d / "bin/python"), str(PEER_DIR / peer.script), url, str(concurrency)], d


def run_env(kind: str, d: Path, venv: Path | None) -> dict[str, str]:
    """A runner's environment variables; caches go in its run folder."""
    if kind == "regen":
        return {}
    peer = PEERS[kind]
    env = {
        **peer.env,
        "OPENAI_API_KEY": KEY,
        "HF_HOME": str(d / "hf"),
        "CURATOR_CACHE_DIR": str(d / "curator-cache"),
    }
    if peer.cl100k and venv is not None:
        env["TIKTOKEN_CACHE_DIR"] = cl100k_dir(venv)
    return env


def output_rows(kind: str, d: Path) -> list[str]:
    """The ids in a runner's output (unreadable lines count as `<bad>`)."""
    path = d / ("out/export/d.jsonl" if kind == "regen" else "out.jsonl")
    if kind == "curator" and not path.exists():
        return curator_cache_rows(d)
    if not path.exists():
        return []
    ids = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            ids.append(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            ids.append("<bad>")
    return ids


def curator_cache_rows(d: Path) -> list[str]:
    """The rows answered in curator's own cache, for a curator run that never returned (so
    never wrote out.jsonl): what a rerun would keep."""
    ids = set()
    for path in d.glob("curator-cache/*/responses_*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                r = json.loads(line)
                if r.get("response_errors") is None and r.get("response_message") is not None:
                    ids.add(str(r["generic_request"]["original_row_idx"]))
    return sorted(ids)


def last_error(d: Path) -> str:
    """The last line of a runner's stderr that looks like an error, for the report."""
    path = d / "stderr.log"
    if not path.exists():
        return ""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""


def prepare(
    tmp: Path, kind: str, label: str, url: str, n: int, conc: int, cap: float | None
) -> Path:
    d = tmp / f"{kind}-{label}-{time.monotonic_ns()}"
    d.mkdir()
    write_prompts(d / "prompts.jsonl", n)
    budget = f"[budget]\nmax_cost_usd = {cap}\n" if cap is not None else ""
    (d / "job.toml").write_text(
        JOB.format(url=url, model=MODEL, max_tokens=MAX_TOKENS, concurrency=conc, budget=budget)
    )
    return d


@dataclass
class Pass:
    """One process of a runner, from fork to exit: its interpreter's start counts, as it does
    for a user who runs the command again."""

    rc: int
    cpu_s: float
    rss_mb: float
    started: float
    """Epoch seconds, so that a kept run folder's state.db can be read against it."""
    wall_s: float
    killed: bool = False
    timed_out: bool = False


def run_pass(
    cmd: list[str], d: Path, env: dict[str, str], timeout_s: float,
    kill_when: Callable[[], bool] | None = None,
) -> Pass:  # fmt: skip
    """Run `cmd` in `d` until it exits, `kill_when()` holds (SIGKILL) or `timeout_s` passes."""
    started, t0 = time.time(), time.monotonic()
    child = Child(spawn(cmd, d, env))
    killed = timed_out = False
    while (done := child.poll()) is None:
        if kill_when is not None and not killed and kill_when():
            child.kill()
            killed = True
        elif not timed_out and time.monotonic() - t0 > timeout_s:
            child.kill()
            timed_out = True
        time.sleep(0.2 if kill_when is not None and not killed else 0.05)
    rc, cpu, rss = done
    return Pass(rc, cpu, rss, started, time.monotonic() - t0, killed, timed_out)


def one_run(
    tmp: Path, kind: str, args: argparse.Namespace, *, label: str, kill_at: float | None = None,
    cap: float | None = None, seed: int = 1, until_complete: bool = False,
) -> dict[str, Any]:  # fmt: skip
    with held(args.lock):
        res = _one_run(
            tmp, kind, args, label=label, kill_at=kill_at, cap=cap, seed=seed,
            until_complete=until_complete,
        )  # fmt: skip
    if args.keep is None:
        shutil.rmtree(res.pop("dir"), ignore_errors=True)
    return res


def _one_run(
    tmp: Path, kind: str, args: argparse.Namespace, *, label: str, kill_at: float | None,
    cap: float | None, seed: int, until_complete: bool,
) -> dict[str, Any]:  # fmt: skip
    proc, url = simproc.start_sim(
        SIM.format(
            ttft_s=TTFT_S,
            tokens_per_s=TOKENS_PER_S,
            seed=seed,
            faults=FAULTS,
            time_scale=args.time_scale,
            model=MODEL,
            mean=args.mean_tokens,
            capacity=args.capacity,
        ),
        tmp,
    )
    note = ""
    more: dict[str, Any] = {}
    try:
        d = prepare(tmp, kind, label, url, args.requests, args.concurrency, cap)
        cmd, venv = command(kind, url, args.concurrency, args.venv_root)
        # The peer's own resume: regen, curator and distilabel rerun the same command.
        resume = cmd if kind == "regen" else [*cmd, "--resume"]
        env = run_env(kind, d, venv)

        def billed_enough() -> bool:
            assert kill_at is not None
            return bool(sim_stats(url, settle=False)["billed"] >= kill_at * args.requests)

        passes = [run_pass(cmd, d, env, args.run_timeout, billed_enough if kill_at else None)]
        if kill_at is not None:
            if passes[0].killed:
                passes.append(run_pass(resume, d, env, args.run_timeout))
            else:
                note = "ended before the kill; "
        stats = sim_stats(url)
        ids = output_rows(kind, d)
        later: list[Pass] = []
        if until_complete:
            later, more = until_answered(kind, args, url, d, resume, env, ids)
            walls = [p.wall_s for p in (*passes, *later)]
            more |= {
                "pass_wall_s": walls,
                "wall_all_s": sum(walls),
                "cpu_all_s": sum(p.cpu_s for p in (*passes, *later)),
            }
    finally:
        proc.terminate()
        proc.wait()
    (d / "bench.json").write_text(json.dumps([vars(p) for p in (*passes, *later)]))
    rc = passes[-1].rc
    unique = {i for i in ids if i != "<bad>"}
    if any(p.timed_out for p in (*passes, *later)):
        note += f"killed after {args.run_timeout:.0f} s; "
    if rc != 0:
        note += f"exit {rc}: {last_error(d)}"
    return {
        "runner": kind,
        "rc": rc,
        "killed": passes[0].killed,
        "wall_s": sum(p.wall_s for p in passes),
        "cpu_s": sum(p.cpu_s for p in passes),
        "rss_mb": max(p.rss_mb for p in passes),
        "rows": len(ids),
        "unique": len(unique),
        "missing": args.requests - len(unique),
        "written_twice": len(ids) - len(unique) - ids.count("<bad>"),
        "unreadable": ids.count("<bad>"),
        "answered_429": int(stats["by_status"].get("429", 0)),
        "requests": stats["chat_requests"],
        "billed": stats["billed"],
        "paid_twice": stats["billed"] - stats["distinct_billed"],
        "spend_usd": stats["billed_usd"],
        "note": note,
        **more,
        "dir": str(d),
    }


def until_answered(
    kind: str, args: argparse.Namespace, url: str, d: Path, resume: list[str],
    env: dict[str, str], ids: list[str],
) -> tuple[list[Pass], dict[str, Any]]:  # fmt: skip
    """After a first pass that left `ids`: run the runner again with its own resume, as a
    user would, while rows are missing and the last pass answered a new row. Against the same
    simulator: a user's rerun meets the same provider, whose faults do not repeat a
    request's, and its bill then counts the answers paid twice over all passes."""
    missing = [args.requests - len(set(ids) - {"<bad>"})]
    later: list[Pass] = []
    while missing[-1] and 1 + len(later) < args.max_passes:
        later.append(run_pass(resume, d, env, args.run_timeout))
        missing.append(args.requests - len(set(output_rows(kind, d)) - {"<bad>"}))
        if missing[-1] >= missing[-2]:
            break
    stats = sim_stats(url)
    end = output_rows(kind, d)
    return later, {
        "passes": 1 + len(later),
        "pass_missing": missing,
        "rc_end": later[-1].rc if later else None,
        "missing_end": missing[-1],
        "written_twice_end": len(end) - len(set(end)) - end.count("<bad>"),
        "requests_all": stats["chat_requests"],
        "answered_429_all": int(stats["by_status"].get("429", 0)),
        "paid_twice_all": stats["billed"] - stats["distinct_billed"],
        "spend_all_usd": stats["billed_usd"],
    }


# report --------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def versions(root: Path) -> dict[str, str]:
    """Each runner's package and version, as installed in its environment."""
    from importlib.metadata import version

    out = {"regen": f"regen {version('regen')}"}
    package = {
        "openai-async": "openai",
        "threadpool": "openai",
        "litellm": "litellm",
        "curator": "bespokelabs-curator",
        "distilabel": "distilabel",
    }
    for kind, peer in PEERS.items():
        d = venv_dir(root, peer.venv)
        if (d / "freeze.txt").exists():
            out[kind] = f"{package[kind]} {installed(d, package[kind])}"
            if kind == "curator":
                out[kind] += f" (litellm {installed(d, 'litellm')})"
            if kind == "distilabel":
                out[kind] += f" (openai {installed(d, 'openai')})"
    return out


def compare(args: argparse.Namespace) -> None:
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="regen-compare-"))
    results = Path(args.results or tmp / "results.jsonl")
    runners = [r for r in RUNNERS if r in args.runners]
    unavailable: dict[str, str] = {}
    for kind in runners:
        if kind in PEERS:
            try:
                ensure_venv(args.venv_root, PEERS[kind].venv, args.lock)
            except subprocess.CalledProcessError as exc:
                unavailable[kind] = f"pip install {' '.join(VENVS[PEERS[kind].venv])}: {exc}"
    runners = [r for r in runners if r not in unavailable]
    workload = {k: getattr(args, k) for k in WORKLOAD}
    print(f"results: {results}", flush=True)

    def log(phase: str, rnd: int, res: dict[str, Any]) -> None:
        record = {"phase": phase, "round": rnd, "workload": workload, **res}
        with results.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"round {rnd} {phase} {res['runner']}: {json.dumps(res)}", flush=True)

    for rnd in range(args.first_round, args.first_round + args.rounds):
        order = runners if rnd % 2 == 1 else list(reversed(runners))
        regen_spend = None
        for kind in order:
            res = one_run(tmp, kind, args, label=f"full-r{rnd}", seed=rnd, until_complete=True)
            log("full", rnd, res)
            if kind == "regen":
                regen_spend = res["spend_usd"]
        for kind in order:
            res = one_run(tmp, kind, args, label=f"kill-r{rnd}", kill_at=args.kill_at, seed=rnd)
            log("kill", rnd, res)
        if regen_spend is not None:
            cap = round(regen_spend * args.cap_fraction, 6)
            res = one_run(tmp, "regen", args, label=f"cap-r{rnd}", cap=cap, seed=rnd)
            res["cap_usd"] = cap
            log("cap", rnd, res)
    report(args, [json.loads(line) for line in results.read_text().splitlines()], unavailable)
    if args.keep is not None and "regen" in runners:
        tail(args)


WORKLOAD = ("requests", "concurrency", "capacity", "time_scale", "mean_tokens", "kill_at")


def report(
    args: argparse.Namespace, records: list[dict[str, Any]], unavailable: dict[str, str]
) -> None:
    """The tables, from every record of the results log (medians over rounds)."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {"full": {}, "kill": {}, "cap": {}}
    for r in records:
        by[r["phase"]].setdefault(r["runner"], []).append(r)
    full, kill, capped = by["full"], by["kill"], by["cap"].get("regen", [])
    w = records[0]["workload"] if records else {k: getattr(args, k) for k in WORKLOAD}
    n = w["requests"]
    rounds = max((len(rs) for rs in full.values()), default=0)
    vers = versions(args.venv_root)
    print()
    print(
        f"{simproc.machine_line()}; "
        f"{n} rows, {w['concurrency']} in flight, provider capacity {w['capacity']}, "
        f"time scale {w['time_scale']}, {rounds} rounds (medians)"
    )
    order = [r for r in RUNNERS if r in full]
    base = full.get("regen") or next(iter(full.values()))
    b_wall, b_cpu, b_rss = (med([r[k] for r in base]) for k in ("wall_s", "cpu_s", "rss_mb"))
    b_rate = med([r["unique"] / r["wall_s"] for r in base])
    print()
    print(
        "| runner | version | wall s | x regen | answers/s | regen x | client CPU s per 1k rows "
        "| x regen | peak RSS MB | x regen | HTTP requests | answered 429 | rows missing "
        "| answers paid twice | complete |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in order:
        rs = full[kind]
        wall, cpu, rss = (med([r[k] for r in rs]) for k in ("wall_s", "cpu_s", "rss_mb"))
        rate = med([r["unique"] / r["wall_s"] for r in rs])
        print(
            f"| {kind} | {vers.get(kind, '?')} | {wall:.1f} | {wall / b_wall:.2f} "
            f"| {rate:.0f} | {b_rate / rate if rate else float('inf'):.2f} "
            f"| {cpu / n * 1000:.2f} | {cpu / b_cpu:.1f} | {rss:.0f} | {rss / b_rss:.1f} "
            f"| {med([r['requests'] for r in rs]):.0f} "
            f"| {med([r['answered_429'] for r in rs]):.0f} "
            f"| {med([r['missing'] for r in rs]):.0f} "
            f"| {med([r['paid_twice'] for r in rs]):.0f} "
            f"| {sum(ok(r) for r in rs)}/{len(rs)} |"
        )
    for kind, why in unavailable.items():
        print(f"| {kind} | - | - | - | - | - | - | - | - | - | - | - | - | - | {why} |")
    until_answered_table(full, order)
    print()
    print(
        f"Killed (SIGKILL to the process group) at {w['kill_at']:.0%} of the rows billed, "
        "then restarted with the peer's own resume:"
    )
    print()
    print(
        "| runner | wall s (both runs) | rows missing | rows written twice | unreadable lines "
        "| answers paid twice | complete |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind in [r for r in RUNNERS if r in kill]:
        rs = kill[kind]
        print(
            f"| {kind} | {med([r['wall_s'] for r in rs]):.1f} "
            f"| {med([r['missing'] for r in rs]):.0f} "
            f"| {med([r['written_twice'] for r in rs]):.0f} "
            f"| {med([r['unreadable'] for r in rs]):.0f} "
            f"| {med([r['paid_twice'] for r in rs]):.0f} "
            f"| {sum(ok(r) for r in rs)}/{len(rs)} |"
        )
    if capped:
        print()
        print(f"A dollar cap of {args.cap_fraction:.0%} of the full run's spend:")
        print()
        print("| runner | cap $ | spent $ | spent / cap |")
        print("|---|---|---|---|")
        cap = med([r["cap_usd"] for r in capped])
        spent = med([r["spend_usd"] for r in capped])
        print(f"| regen | {cap:.4f} | {spent:.4f} | {spent / cap:.3f} |")
        for kind in order:
            if kind == "regen":
                continue
            s = med([r["spend_usd"] for r in full[kind]])
            print(
                f"| {kind} (no cap option: spends the whole workload) | {cap:.4f} | {s:.4f} "
                f"| {s / cap:.3f} |"
            )
    notes = [r for rs in (*full.values(), *kill.values()) for r in rs if r.get("note")]
    if notes:
        print()
        print("Runs that did not exit 0:")
        print()
        for r in notes:
            print(f"- {r['runner']} ({r['phase']}, round {r['round']}): {r['note']}")


def until_answered_table(full: dict[str, list[dict[str, Any]]], order: list[str]) -> None:
    """Time to every row answered: a runner that leaves rows missing is run again with its own
    resume until none are missing or a pass answers no new row (`until_answered`). A round
    that never got every row counts as infinitely long, so a median over rounds says "not
    reached" when most rounds did not."""
    rounds = {k: [r for r in full[k] if "passes" in r] for k in order}
    if not any(rounds.values()):
        print()
        print("(This log predates the time to every row answered: full runs had one pass.)")
        return

    def to_all(r: dict[str, Any]) -> float:
        return float(r["wall_all_s"]) if r["missing_end"] == 0 else float("inf")

    base = med([to_all(r) for r in rounds.get("regen", [])])
    print()
    print(
        "Until every row is answered: a runner that left rows missing is run again with its "
        "own resume (same simulator) until none are missing or a pass answers no new row. "
        "Time to every row answered is the sum of the passes' wall times, each from its "
        "process start:"
    )
    print()
    print(
        "| runner | single pass wall s | rows missing after one pass | passes "
        "| time to every row answered s | x regen | rows missing at the end "
        "| answers paid twice (all passes) | rows missing after each pass, per round "
        "| every row answered |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in order:
        rs = rounds[kind]
        if not rs:
            continue
        t = med([to_all(r) for r in rs])
        shown = f"{t:.1f}" if t != float("inf") else "not reached"
        ratio = f"{t / base:.2f}" if t != float("inf") and base not in (0, float("inf")) else "-"
        per_round = "; ".join("→".join(str(m) for m in r["pass_missing"]) for r in rs)
        print(
            f"| {kind} | {med([r['wall_s'] for r in rs]):.1f} "
            f"| {med([r['missing'] for r in rs]):.0f} | {med([r['passes'] for r in rs]):.0f} "
            f"| {shown} | {ratio} | {med([r['missing_end'] for r in rs]):.0f} "
            f"| {med([r['paid_twice_all'] for r in rs]):.0f} | {per_round} "
            f"| {sum(r['missing_end'] == 0 for r in rs)}/{len(rs)} |"
        )


def ok(r: dict[str, Any]) -> bool:
    return bool(r["rc"] == 0 and r["missing"] == 0 and r["written_twice"] == 0)


def setup(args: argparse.Namespace) -> None:
    """Make (or find) each chosen peer's environment and print what it holds."""
    names = dict.fromkeys(PEERS[r].venv for r in args.runners if r in PEERS)
    for name in names:
        started = time.monotonic()
        d = ensure_venv(args.venv_root, name, args.lock)
        print(f"{name}: {d} ({time.monotonic() - started:.0f} s): {' '.join(VENVS[name])}")
    for kind, v in versions(args.venv_root).items():
        print(f"  {kind}: {v}")


# regen's tail --------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0..1) of `values`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def regen_tail(d: Path, time_scale: float) -> dict[str, str]:
    """How a kept regen run folder's single pass ended, read from its state.db against the
    bench's clock (bench.json: the process's fork and exit): what to shorten for a faster
    single pass (start-up, the last answers, retries, shutdown)."""
    import sqlite3

    first = json.loads((d / "bench.json").read_text())[0]
    t0, wall = first["started"], first["wall_s"]
    db = sqlite3.connect(f"file:{d / 'out/state.db'}?mode=ro", uri=True)
    # The first pass only: a regen that left failed items was run again (until_answered).
    attempts = db.execute(
        "SELECT item_id, number, started_at, latency_s, status, failure_class FROM attempts "
        "WHERE started_at < ? ORDER BY item_id, number",
        (t0 + wall,),
    ).fetchall()
    run_start, run_end = db.execute(
        "SELECT started_at, ended_at FROM runs WHERE kind = 'run' ORDER BY id LIMIT 1"
    ).fetchone()
    db.close()
    ends = sorted(a[2] + a[3] for a in attempts if a[5] is None)
    sends = [a[2] for a in attempts]
    by_item: dict[str, list[tuple[Any, ...]]] = {}
    for a in attempts:
        by_item.setdefault(a[0], []).append(a)
    retried = {i: at for i, at in by_item.items() if len(at) > 1}
    # The wait before each retry: from the failed attempt's end to the next one's send.
    waits = [b[2] - (a[2] + a[3]) for at in retried.values() for a, b in itertools.pairwise(at)]
    classes: dict[str, int] = {}
    for a in attempts:
        if a[5] is not None:
            key = f"{a[5]} ({a[4]})" if a[4] else a[5]
            classes[key] = classes.get(key, 0) + 1
    latency = [a[3] for a in attempts if a[5] is None]
    to_answer = [at[-1][2] + at[-1][3] - at[0][2] for at in by_item.values() if at[-1][5] is None]
    retried_to_answer = [
        at[-1][2] + at[-1][3] - at[0][2] for at in retried.values() if at[-1][5] is None
    ]
    last_1pct = ends[-max(1, len(ends) // 100) :]
    slowest_s = (TTFT_S + MAX_TOKENS / TOKENS_PER_S) * time_scale
    late = [
        at for at in by_item.values() if at[-1][5] is None and at[-1][2] + at[-1][3] >= last_1pct[0]
    ]
    window = (t0 + 0.9 * wall, t0 + wall)
    spans = [(a[2], a[2] + a[3]) for a in attempts]
    samples = [window[0] + (window[1] - window[0]) * k / 100 for k in range(101)]
    in_flight = [sum(s <= t < e for s, e in spans) for t in samples]

    def at(t: float | None) -> str:
        return f"{t - t0:.2f}" if t is not None else "-"

    return {
        "process wall s (fork to exit)": f"{wall:.2f}",
        "run started (regen's runs table) s": at(run_start),
        "first request sent s": at(min(sends)),
        "99% of answers in s": at(pct(ends, 0.99)),
        "last first attempt sent s": at(max(a[2] for a in attempts if a[1] == 1)),
        "last request sent s": at(max(sends)),
        "last answer in s": at(ends[-1]),
        "run ended (runs table) s": at(run_end),
        "exit after the last answer s": f"{t0 + wall - ends[-1]:.2f}",
        "attempts / items": f"{len(attempts)} / {len(by_item)}",
        "items retried": str(len(retried)),
        "failed attempts by class (HTTP status)": ", ".join(
            f"{k} {v}" for k, v in sorted(classes.items(), key=lambda kv: -kv[1])
        ),
        "wait before a retry s (median / max)": f"{med(waits):.2f} / {max(waits, default=0):.2f}",
        "retried item, first send to answer s (median / max)": (
            f"{med(retried_to_answer):.2f} / {max(retried_to_answer, default=0):.2f}"
        ),
        "answer latency s (p50 / p99 / max)": (
            f"{pct(latency, 0.5):.2f} / {pct(latency, 0.99):.2f} / {max(latency):.2f}"
        ),
        f"answers over the longest generation + 1 s ({slowest_s + 1:.1f} s): stalls": str(
            sum(x > slowest_s + 1 for x in latency)
        ),
        "item, first send to answer s (p50 / p99 / max)": (
            f"{pct(to_answer, 0.5):.2f} / {pct(to_answer, 0.99):.2f} / {max(to_answer):.2f}"
        ),
        "last 1% of answers: retried / answer latency > 2x p50": (
            f"{sum(len(at) > 1 for at in late)} of {len(late)} / "
            f"{sum(at[-1][3] > 2 * pct(latency, 0.5) for at in late)} of {len(late)}"
        ),
        "last 1% of answers: first sent s (median / min)": (
            f"{med([at[0][2] - t0 for at in late]):.2f} / {min(at[0][2] - t0 for at in late):.2f}"
        ),
        "last 3 answers: first sent s + latency s (attempts)": ", ".join(
            f"{at[0][2] - t0:.2f} + {at[-1][3]:.2f} ({len(at)})"
            for at in sorted(late, key=lambda at: at[-1][2] + at[-1][3])[-3:]
        ),
        "in flight over the last 10% of the wall (mean / max / at its start)": (
            f"{statistics.fmean(in_flight):.1f} / {max(in_flight)} / {in_flight[0]}"
        ),
    }


def tail(args: argparse.Namespace) -> None:
    """regen's tail in each kept full run (`--keep DIR` of a compare run), one column a run."""
    dirs = sorted(args.keep.glob("regen-full-r*-*"), key=lambda p: p.name)
    dirs = [d for d in dirs if (d / "bench.json").exists() and (d / "out/state.db").exists()]
    if not dirs:
        raise SystemExit(f"no kept regen full runs (regen-full-r*) in {args.keep}")
    tails = [regen_tail(d, args.time_scale) for d in dirs]
    print()
    print("regen's single pass, seconds from its process start:")
    print()
    print("| | " + " | ".join(d.name.rsplit("-", 1)[0] for d in dirs) + " |")
    print("|---|" + "---|" * len(dirs))
    for key in tails[0]:
        print(f"| {key} | " + " | ".join(t[key] for t in tails) + " |")


# scale ---------------------------------------------------------------------------------------


def scale(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="regen-scale-"))
    print(simproc.machine_line())
    print(
        "| requests | lane concurrency | peak in flight | done | wall s | CPU ms per request "
        "| peak RSS MB | RSS KB per in-flight request |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for conc, time_scale in zip(args.levels, args.level_time_scales, strict=True):
        # Answers slow enough that `conc` are on the wire together at the rate the client and
        # the simulator keep up (about 800 a second here); no capacity limit, no faults.
        sim = SIM.format(
            seed=1, faults="", time_scale=time_scale, model=MODEL, mean=args.mean_tokens,
            capacity=0, ttft_s=TTFT_S, tokens_per_s=TOKENS_PER_S,
        )  # fmt: skip
        proc, url = simproc.start_sim(sim, tmp)
        try:
            d = prepare(tmp, "regen", f"scale-{conc}", url, args.requests, conc, None)
            text = (d / "job.toml").read_text().replace("[run]", f"[run]\ninitial_limit = {conc}")
            (d / "job.toml").write_text(text)
            started = time.monotonic()
            rc, cpu, rss = reap(spawn(command("regen", url, conc, args.venv_root)[0], d, {}))
            wall = time.monotonic() - started
            stats = sim_stats(url)
        finally:
            proc.terminate()
            proc.wait()
        done = len(set(output_rows("regen", d)))
        peak = stats["peak_in_flight"]
        print(
            f"| {args.requests} | {conc} | {peak} | {done} | {wall:.0f} | "
            f"{cpu / args.requests * 1000:.3f} | {rss:.0f} | {rss * 1024 / max(1, peak):.1f} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "mode",
        nargs="?",
        choices=("compare", "setup", "report", "scale", "tail"),
        default="compare",
    )
    ap.add_argument("--requests", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-round", type=int, default=1, help="number the rounds from here")
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument(
        "--capacity", type=int, default=400, help="requests the provider serves at once"
    )
    ap.add_argument("--mean-tokens", type=int, default=120)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--kill-at", type=float, default=0.4)
    ap.add_argument("--cap-fraction", type=float, default=0.5)
    ap.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    ap.add_argument(
        "--venv-root", type=Path, default=Path("/tmp/regen-peers"), help="peers' environments"
    )
    ap.add_argument(
        "--lock", help="flock this file around each run and install (not under an outer flock)"
    )
    ap.add_argument("--results", help="append each run's record here (JSON lines)")
    ap.add_argument("--run-timeout", type=float, default=600, help="kill a pass after this")
    ap.add_argument(
        "--max-passes",
        type=int,
        default=10,
        help="full runs: at most this many passes (the first and the resumes) to answer all",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        help="keep each run's folder (state.db, run.log, outputs) under this folder; without "
        "it they are removed once measured",
    )
    ap.add_argument("--levels", type=int, nargs="+", default=[2000, 10000])
    ap.add_argument(
        "--level-time-scales",
        type=float,
        nargs="+",
        default=[0.4, 2.0],
        help="scale: the simulator's time scale at each level (answers of 2.5 s and 12.5 s)",
    )
    args = ap.parse_args()
    if args.mode == "scale":
        args.requests = args.requests or 100_000
        scale(args)
    elif args.mode == "setup":
        setup(args)
    elif args.mode == "tail":
        if not args.keep:
            ap.error("tail needs --keep DIR (a compare run's kept folders)")
        tail(args)
    elif args.mode == "report":
        if not args.results:
            ap.error("report needs --results FILE")
        lines = Path(args.results).read_text().splitlines()
        report(args, [json.loads(line) for line in lines], {})
    else:
        args.requests = args.requests or 3_000
        compare(args)


if __name__ == "__main__":
    main()
