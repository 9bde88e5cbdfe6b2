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
   paid twice (the simulator's bill: billed answers less distinct ones);
2. a kill and restart: SIGKILL to the process group once `--kill-at` of the rows are billed,
   then the peer's own resume: rows missing, rows written twice, answers paid twice;
3. a dollar cap of `--cap-fraction` of the full run's spend: regen runs with
   `[budget] max_cost_usd`; no peer has a cap, so their spend is the full run's.

    .venv/bin/python bench/compare.py setup                 # make the peers' environments
    .venv/bin/python bench/compare.py [--requests 3000] [--rounds 3] [--lock /tmp/bench.lock]
    .venv/bin/python bench/compare.py report --results FILE  # the tables again, from a log
    .venv/bin/python bench/compare.py scale [--requests 100000]   # regen at 2,000 and 10,000

The default workload is issue 23's: 3,000 prompts, 512 in flight, capacity 400, ~1% faults.
`--lock PATH` holds an exclusive flock on PATH around each measured run and each install, so
runs of other benchmarks on the machine never overlap a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
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
ttft_s = 0.4
tokens_per_s = 80
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
max_tokens = 2048

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


def prepare(tmp: Path, kind: str, url: str, n: int, conc: int, cap: float | None) -> Path:
    d = tmp / f"{kind}-{time.monotonic_ns()}"
    d.mkdir()
    write_prompts(d / "prompts.jsonl", n)
    budget = f"[budget]\nmax_cost_usd = {cap}\n" if cap is not None else ""
    (d / "job.toml").write_text(JOB.format(url=url, model=MODEL, concurrency=conc, budget=budget))
    return d


def one_run(
    tmp: Path, kind: str, args: argparse.Namespace, *, kill_at: float | None = None,
    cap: float | None = None, seed: int = 1,
) -> dict[str, Any]:  # fmt: skip
    with held(args.lock):
        return _one_run(tmp, kind, args, kill_at=kill_at, cap=cap, seed=seed)


def _one_run(
    tmp: Path, kind: str, args: argparse.Namespace, *, kill_at: float | None,
    cap: float | None, seed: int,
) -> dict[str, Any]:  # fmt: skip
    proc, url = simproc.start_sim(
        SIM.format(
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
    try:
        d = prepare(tmp, kind, url, args.requests, args.concurrency, cap)
        cmd, venv = command(kind, url, args.concurrency, args.venv_root)
        env = run_env(kind, d, venv)
        started = time.monotonic()
        deadline = started + args.run_timeout
        child = Child(spawn(cmd, d, env))
        cpu = rss = 0.0
        killed = False
        rc: int | None = None
        if kill_at is not None:
            while (done := child.poll()) is None:
                if sim_stats(url, settle=False)["billed"] >= kill_at * args.requests:
                    child.kill()
                    killed = True
                    break
                time.sleep(0.2)
            if killed:
                while (done := child.poll()) is None:
                    time.sleep(0.05)
                _, c, r = done
                cpu, rss = cpu + c, max(rss, r)
                # The peer's own resume: regen, curator and distilabel rerun the same command.
                child = Child(spawn([*cmd, "--resume"] if kind != "regen" else cmd, d, env))
            else:
                note = "ended before the kill; "
                assert done is not None
                rc, c, r = done
                cpu, rss = cpu + c, max(rss, r)
        if rc is None:
            while (done := child.poll()) is None:
                if time.monotonic() > deadline and "killed after" not in note:
                    child.kill()
                    note += f"killed after {args.run_timeout:.0f} s; "
                time.sleep(0.05)
            rc, c, r = done
            cpu, rss = cpu + c, max(rss, r)
        wall = time.monotonic() - started
        stats = sim_stats(url)
    finally:
        proc.terminate()
        proc.wait()
    ids = output_rows(kind, d)
    unique = {i for i in ids if i != "<bad>"}
    if rc != 0:
        note += f"exit {rc}: {last_error(d)}"
    return {
        "runner": kind,
        "rc": rc,
        "killed": killed,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_mb": rss,
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
        "dir": str(d),
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
    tmp = Path(tempfile.mkdtemp(prefix="regen-compare-"))
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
            res = one_run(tmp, kind, args, seed=rnd)
            log("full", rnd, res)
            if kind == "regen":
                regen_spend = res["spend_usd"]
        for kind in order:
            log("kill", rnd, one_run(tmp, kind, args, kill_at=args.kill_at, seed=rnd))
        if regen_spend is not None:
            cap = round(regen_spend * args.cap_fraction, 6)
            res = one_run(tmp, "regen", args, cap=cap, seed=rnd)
            res["cap_usd"] = cap
            log("cap", rnd, res)
    report(args, [json.loads(line) for line in results.read_text().splitlines()], unavailable)


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
            capacity=0,
        )  # fmt: skip
        proc, url = simproc.start_sim(sim, tmp)
        try:
            d = prepare(tmp, "regen", url, args.requests, conc, None)
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
        "mode", nargs="?", choices=("compare", "setup", "report", "scale"), default="compare"
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
    ap.add_argument("--run-timeout", type=float, default=600, help="kill a run after this")
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
