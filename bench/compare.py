"""regen against its peers on one workload, side by side (issue 12).

The same prompts (heterogeneous lengths), the same simulated provider (a concurrency capacity,
429 with Retry-After above it, faults at realistic rates), run by:

- `regen`: `regen run job.toml` (one lane; adaptive limit; retries; state.db; export).
- `openai-async`: the naive baseline: `openai.AsyncOpenAI` (its default two retries) behind an
  `asyncio.Semaphore`, each answer appended to a JSONL as it arrives; a restart skips the ids
  already in the file.
- `threadpool`: SpecForge's `regenerate_train_data.py` pattern: a `ThreadPoolExecutor` of
  synchronous `openai.OpenAI` calls, results appended in completion order to `out.jsonl` and
  failures to `out_error.jsonl`; `--resume` skips as many input rows as both files have lines.
- `curator` (bespokelabs-curator) when it installs; it is not in this machine's package
  registry, which the report says.

Each runner is its own process pinned to core 1 (the simulator, started afresh for every run,
is pinned to core 0), alternated within each round. Per runner and round:

1. a full run: wall time, answers per second, client CPU seconds per 1,000 requests (user +
   system from wait4), peak RSS, requests answered 429, whether the output is complete;
2. a kill and restart: SIGKILL once `--kill-at` of the requests are billed, then the same
   command again: rows missing from the output, rows written twice, answers paid twice;
3. a dollar cap of `--cap-fraction` of the full run's spend: regen runs with
   `[budget] max_cost_usd`; the others have no cap, so their spend is the full run's.

    .venv/bin/python bench/compare.py [--requests 20000] [--rounds 3] [--concurrency 512]
    .venv/bin/python bench/compare.py scale [--requests 100000]   # regen at 2,000 and 10,000

The openai runners need `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import simproc

HERE = Path(__file__).resolve()
KEY = "sk-bench-not-a-secret"
MODEL = "bench/model"
RUNNERS = ("regen", "openai-async", "threadpool")

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


# processes -----------------------------------------------------------------------------------


def spawn(args: list[str], cwd: Path) -> int:
    """Start a client pinned to core 1; its output goes to files in cwd."""
    env = {**os.environ, "BENCH_KEY": KEY}
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(cwd)
            out = os.open("stdout.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            err = os.open("stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.execvpe("taskset", ["taskset", "-c", "1", *args], env)
        finally:
            os._exit(127)
    return pid


def reap(pid: int) -> tuple[int, float, float]:
    """(exit code, CPU seconds, peak RSS MB) of a child."""
    _, status, usage = os.wait4(pid, 0)
    return (
        os.waitstatus_to_exitcode(status),
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
    )


def sim_stats(url: str) -> dict[str, Any]:
    """What the simulator served and billed, once the generations a killed runner left behind
    have ended (the simulator bills an answer when its generation ends)."""
    base = url.rsplit("/api/v1", 1)[0]
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"{base}/_sim/stats", timeout=10) as r:
            data: dict[str, Any] = json.loads(r.read())
        if not data.get("unbilled") or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def command(kind: str, url: str, concurrency: int) -> list[str]:
    if kind == "regen":
        return [sys.executable, "-m", "regen", "run", "job.toml"]
    return [sys.executable, str(HERE), "_runner", kind, url, str(concurrency)]


def output_rows(kind: str, d: Path) -> list[str]:
    """The ids in a runner's output (unreadable lines count as `<bad>`)."""
    path = d / ("out/export/d.jsonl" if kind == "regen" else "out.jsonl")
    if not path.exists():
        return []
    ids = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            ids.append(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            ids.append("<bad>")
    return ids


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
    try:
        d = prepare(tmp, kind, url, args.requests, args.concurrency, cap)
        cmd = command(kind, url, args.concurrency)
        started = time.monotonic()
        pid = spawn(cmd, d)
        cpu = rss = 0.0
        killed = False
        if kill_at is not None:
            while True:
                time.sleep(0.2)
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    raise SystemExit(f"{kind} ended before the kill; see {d}/stderr.log")
                if sim_stats(url)["billed"] >= kill_at * args.requests:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    break
            _, c, r = reap(pid)
            cpu, rss = cpu + c, max(rss, r)
            pid = spawn([*cmd, "--resume"] if kind != "regen" else cmd, d)
        rc, c, r = reap(pid)
        wall = time.monotonic() - started
        cpu, rss = cpu + c, max(rss, r)
        stats = sim_stats(url)
    finally:
        proc.terminate()
        proc.wait()
    ids = output_rows(kind, d)
    unique = {i for i in ids if i != "<bad>"}
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
        "dir": str(d),
    }


# baselines (run in the child) ----------------------------------------------------------------


def _rows() -> list[tuple[int, list[dict[str, str]]]]:
    rows = []
    with open("prompts.jsonl") as f:
        for i, line in enumerate(f):
            rows.append((i, json.loads(line)["messages"]))
    return rows


def run_openai_async(url: str, concurrency: int, resume: bool) -> None:
    import asyncio

    import openai

    rows = _rows()
    if resume and os.path.exists("out.jsonl"):
        done = set()
        with open("out.jsonl", errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError):
                    done.add(json.loads(line)["id"])
        rows = [r for r in rows if r[0] not in done]

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key=KEY)
        sem = asyncio.Semaphore(concurrency)
        failed = 0

        async def one(i: int, messages: list[dict[str, str]]) -> None:
            nonlocal failed
            async with sem:
                try:
                    r = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=2048
                    )
                    content = r.choices[0].message.content
                except Exception:  # noqa: BLE001 - the naive loop logs and moves on
                    failed += 1
                    return
                out.write(json.dumps({"id": i, "content": content}) + "\n")

        await asyncio.gather(*(one(i, m) for i, m in rows))
        print(json.dumps({"failed": failed}))

    with open("out.jsonl", "a") as out:  # buffered, as such loops write
        asyncio.run(main())


def run_threadpool(url: str, concurrency: int, resume: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import openai

    rows = _rows()
    if resume:
        skip = 0
        for name in ("out.jsonl", "out_error.jsonl"):
            if os.path.exists(name):
                with open(name, errors="replace") as f:
                    skip += sum(1 for _ in f)
        rows = rows[skip:]  # SpecForge's --resume: skip as many input rows as lines written
    client = openai.OpenAI(base_url=url, api_key=KEY)

    def call(i: int, messages: list[dict[str, str]]) -> dict[str, Any]:
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2048)
        return {"id": i, "content": r.choices[0].message.content, "status": "success"}

    with (
        ThreadPoolExecutor(max_workers=concurrency) as pool,
        open("out.jsonl", "a") as out,
        open("out_error.jsonl", "a") as err,
    ):
        futures = {pool.submit(call, i, m): i for i, m in rows}
        for fut in as_completed(futures):
            try:
                out.write(json.dumps(fut.result()) + "\n")
            except Exception as exc:  # noqa: BLE001
                err.write(json.dumps({"id": futures[fut], "error": str(exc)[:200]}) + "\n")


def runner_main(argv: list[str]) -> None:
    kind, url, conc = argv[0], argv[1], int(argv[2])
    resume = "--resume" in argv
    if kind == "openai-async":
        run_openai_async(url, conc, resume)
    elif kind == "threadpool":
        run_threadpool(url, conc, resume)
    else:
        raise SystemExit(f"unknown runner {kind}")


# report --------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def curator_note() -> str:
    try:
        import bespokelabs  # type: ignore[import-not-found]  # noqa: F401

        return "installed, but no runner is written for it yet"
    except ImportError:
        return "not installable here: bespokelabs-curator is not in this machine's package registry"


def compare(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="regen-compare-"))
    runners = [r for r in RUNNERS if r in args.runners]
    full: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
    kill: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
    capped: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = runners if rnd % 2 == 0 else list(reversed(runners))
        for kind in order:
            res = one_run(tmp, kind, args, seed=rnd + 1)
            full[kind].append(res)
            print(f"round {rnd + 1} full {kind}: {json.dumps(res)}", flush=True)
        for kind in order:
            res = one_run(tmp, kind, args, kill_at=args.kill_at, seed=rnd + 1)
            kill[kind].append(res)
            print(f"round {rnd + 1} kill {kind}: {json.dumps(res)}", flush=True)
        if "regen" in runners:
            cap = round(full["regen"][-1]["spend_usd"] * args.cap_fraction, 6)
            res = one_run(tmp, "regen", args, cap=cap, seed=rnd + 1)
            res["cap_usd"] = cap
            capped.append(res)
            print(f"round {rnd + 1} cap regen: {json.dumps(res)}", flush=True)
    report(args, full, kill, capped)


def report(
    args: argparse.Namespace,
    full: dict[str, list[dict[str, Any]]],
    kill: dict[str, list[dict[str, Any]]],
    capped: list[dict[str, Any]],
) -> None:
    n = args.requests
    print()
    print(
        f"{simproc.machine_line()}; "
        f"{n} requests, concurrency {args.concurrency}, provider capacity {args.capacity}, "
        f"time scale {args.time_scale}, {args.rounds} rounds (medians)"
    )
    base = full.get("regen") or next(iter(full.values()))
    b_wall = med([r["wall_s"] for r in base])
    b_cpu = med([r["cpu_s"] for r in base])
    b_rss = med([r["rss_mb"] for r in base])
    print()
    print(
        "| runner | wall s | x regen | answers/s | CPU s per 1k requests | x regen | peak RSS MB "
        "| x regen | answered 429 | rows missing | complete |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, rs in full.items():
        wall, cpu, rss = (med([r[k] for r in rs]) for k in ("wall_s", "cpu_s", "rss_mb"))
        print(
            f"| {kind} | {wall:.1f} | {wall / b_wall:.2f} "
            f"| {med([r['unique'] / r['wall_s'] for r in rs]):.0f} "
            f"| {cpu / n * 1000:.2f} | {cpu / b_cpu:.1f} | {rss:.0f} | {rss / b_rss:.1f} "
            f"| {med([r['answered_429'] for r in rs]):.0f} "
            f"| {med([r['missing'] for r in rs]):.0f} "
            f"| {sum(r['missing'] == 0 and r['written_twice'] == 0 for r in rs)}/{len(rs)} |"
        )
    print(f"| curator | - | - | - | - | - | - | - | - | - | {curator_note()} |")
    print()
    print(f"Killed (SIGKILL) at {args.kill_at:.0%} of the requests billed, then restarted:")
    print()
    print(
        "| runner | rows missing | rows written twice | unreadable lines | answers paid twice "
        "| complete |"
    )
    print("|---|---|---|---|---|---|")
    for kind, rs in kill.items():
        print(
            f"| {kind} | {med([r['missing'] for r in rs]):.0f} "
            f"| {med([r['written_twice'] for r in rs]):.0f} "
            f"| {med([r['unreadable'] for r in rs]):.0f} "
            f"| {med([r['paid_twice'] for r in rs]):.0f} "
            f"| {sum(r['missing'] == 0 and r['written_twice'] == 0 for r in rs)}/{len(rs)} |"
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
        for kind, rs in full.items():
            if kind == "regen":
                continue
            s = med([r["spend_usd"] for r in rs])
            print(
                f"| {kind} (no cap option: spends the whole workload) | {cap:.4f} | {s:.4f} "
                f"| {s / cap:.3f} |"
            )


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
            rc, cpu, rss = reap(spawn(command("regen", url, conc), d))
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
    if len(sys.argv) > 1 and sys.argv[1] == "_runner":
        runner_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", nargs="?", choices=("compare", "scale"), default="compare")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument(
        "--capacity", type=int, default=400, help="requests the provider serves at once"
    )
    ap.add_argument("--mean-tokens", type=int, default=120)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--kill-at", type=float, default=0.4)
    ap.add_argument("--cap-fraction", type=float, default=0.5)
    ap.add_argument("--runners", nargs="+", default=list(RUNNERS))
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
    else:
        args.requests = args.requests or 20_000
        compare(args)


if __name__ == "__main__":
    main()
