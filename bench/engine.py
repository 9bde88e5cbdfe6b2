"""The request engine's benchmarks (issue 4), each runner in its own process, side by side.

The simulator runs as `regen sim` pinned to core 0; every client runs pinned to core 1, and its
CPU is the child's user + system time from wait4(). Results are medians over `--rounds`.

    .venv/bin/python bench/engine.py all          # or: cpu | stream | inflight | capacity

cpu       client CPU per non-streamed request, per attempted and per succeeded request with
          the failure rate beside them, at 256 and 2,000 in flight (`--cpu-levels`): `regen
          run` (marginal, from two run sizes: ingest, dispatch, SQLite and export included),
          regen's HTTP client alone, aiohttp alone (the floor), and the openai SDK
          AsyncOpenAI + asyncio.Semaphore with its pool sized to the concurrency.
stream    client CPU per streamed SSE chunk (regen's client, 200 streams in flight).
inflight  10,000 requests in flight at once through `regen run`: errors and peak RSS.
capacity  a provider that serves 500 at once (429 above that) behind a lane of 2,000:
          achieved throughput against the capacity-limited ideal, and the share of 429s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import simproc

HERE = Path(__file__).resolve()
KEY = "sk-bench-not-a-secret"

SIM = """
seed = 1
time_scale = {time_scale}

[[models]]
id = "bench/model"
mean_completion_tokens = {mean}

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
prompt_price = 1e-7
completion_price = 1e-6
ttft_s = {ttft}
tokens_per_s = {tps}
capacity = {capacity}
"""

JOB = """
[job]
output_dir = "out"

[endpoint]
base_url = "{url}"
api_key_env = "BENCH_KEY"

[generation]
model = "bench/model"
max_tokens = 4096

[run]
initial_limit = {initial}
progress_interval_s = 1
stop_grace_s = 5
timeout_s = 600

[[lanes]]
name = "main"
concurrency = {concurrency}
stream = {stream}

[[datasets]]
name = "d"
path = "d.jsonl"
"""


# processes


def start_sim(tmp: Path, **kw: Any) -> tuple[subprocess.Popen[str], str]:
    params = {"time_scale": 0.0, "mean": 50, "ttft": 0.2, "tps": 200.0, "capacity": 0, **kw}
    return simproc.start_sim(SIM.format(**params), tmp)


def child_usage(args: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """Run a client pinned to core 1: wall time, exit code, stdout, and its own CPU seconds
    and peak RSS (fork + wait4, so nothing else is counted)."""
    env = {**os.environ, "BENCH_KEY": KEY}
    r, w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.chdir(cwd or os.getcwd())
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.execvpe("taskset", ["taskset", "-c", "1", *args], env)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status, usage = os.wait4(pid, 0)
    return {
        "wall_s": time.monotonic() - started,
        "stdout": out,
        "rc": os.waitstatus_to_exitcode(status),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_mb": usage.ru_maxrss / 1024,
    }


def write_dataset(path: Path, n: int, salt: str = "") -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"request {salt}{i}"},
                            {"role": "assistant", "content": "x"},
                        ]
                    }
                )
                + "\n"
            )


def regen_run(
    tmp: Path, url: str, n: int, *, concurrency: int, initial: int, stream: bool = False
) -> dict[str, Any]:
    d = tmp / f"job-{n}-{time.monotonic_ns()}"
    d.mkdir()
    write_dataset(d / "d.jsonl", n, salt=d.name)
    (d / "job.toml").write_text(
        JOB.format(url=url, concurrency=concurrency, initial=initial, stream=str(stream).lower())
    )
    res = child_usage([sys.executable, "-m", "regen", "run", "job.toml"], cwd=d)
    res["out"] = d / "out"
    return res


def db(out: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(out / "state.db")
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# worker modes (run in the child process)


def request_body(i: int) -> dict[str, Any]:
    return {
        "model": "bench/model",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": f"request {i}"}],
    }


async def _openai_worker(url: str, n: int, concurrency: int) -> dict[str, Any]:
    import httpx2
    import openai

    http = openai.DefaultAsyncHttpxClient(
        limits=httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    )
    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, http_client=http, max_retries=0)
    sem = asyncio.Semaphore(concurrency)
    ok = failed = 0

    async def one(i: int) -> None:
        nonlocal ok, failed
        async with sem:
            try:
                await client.chat.completions.create(**request_body(i))
                ok += 1
            except openai.OpenAIError:
                failed += 1

    cpu0 = time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return {"ok": ok, "failed": failed, "cpu_s": time.process_time() - cpu0}


async def _regen_client_worker(
    url: str, n: int, concurrency: int, stream: bool, read_interval_s: float = 0.0
) -> dict[str, Any]:
    from regen.engine.client import ChatClient, Timeouts
    from regen.errors import EndpointError

    sem = asyncio.Semaphore(concurrency)
    ok = failed = 0
    timeouts = Timeouts(read_interval_s=read_interval_s)
    async with ChatClient(url, KEY, concurrency=concurrency) as client:

        async def one(i: int) -> None:
            nonlocal ok, failed
            async with sem:
                try:
                    await client.chat(str(i), request_body(i), stream=stream, timeouts=timeouts)
                    ok += 1
                except EndpointError:
                    failed += 1

        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        cpu = time.process_time() - cpu0
        chunks = client.chunks_received
    return {"ok": ok, "failed": failed, "cpu_s": cpu, "chunks": chunks}


async def _aiohttp_worker(
    url: str, n: int, concurrency: int, stream: bool, read_interval_s: float = 0.0
) -> dict[str, Any]:
    """The floor: aiohttp alone, a pool sized to the concurrency, the body read and not
    parsed (a stream's chunks are counted). With a read interval it pauses the transport
    between reads with regen's own helper."""
    import aiohttp

    from regen.engine.client.http import read_later

    sem = asyncio.Semaphore(concurrency)
    ok = failed = chunks = 0
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(i: int) -> None:
            nonlocal ok, failed, chunks
            body = {**request_body(i), **({"stream": True} if stream else {})}
            async with sem:
                try:
                    async with session.post(f"{url}/chat/completions", json=body) as resp:
                        if not stream:
                            await resp.read()
                        else:
                            transport = resp.connection.transport if resp.connection else None
                            piece = await resp.content.readany()
                            while piece:
                                chunks += piece.count(b"data: {")
                                if read_interval_s and transport is not None:
                                    piece = await read_later(
                                        transport, resp.content, read_interval_s
                                    )
                                else:
                                    piece = await resp.content.readany()
                        ok += resp.status == 200
                        failed += resp.status != 200
                except aiohttp.ClientError:
                    failed += 1

        cpu0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        cpu = time.process_time() - cpu0
    return {"ok": ok, "failed": failed, "cpu_s": cpu, "chunks": chunks}


def worker_main(argv: list[str]) -> None:
    kind, url, n, conc = argv[0], argv[1], int(argv[2]), int(argv[3])
    interval = float(argv[4]) if len(argv) > 4 else 0.0
    if kind == "openai":
        res = asyncio.run(_openai_worker(url, n, conc))
    elif kind.startswith("aiohttp"):
        res = asyncio.run(_aiohttp_worker(url, n, conc, kind == "aiohttp-stream", interval))
    else:
        stream = kind == "regen-stream"
        res = asyncio.run(_regen_client_worker(url, n, conc, stream, interval))
    print(json.dumps(res))


def worker(
    kind: str, url: str, n: int, concurrency: int, read_interval_s: float = 0.0
) -> dict[str, Any]:
    args = [kind, url, str(n), str(concurrency), str(read_interval_s)]
    res = child_usage([sys.executable, str(HERE), "_worker", *args])
    inner = json.loads(res["stdout"].strip().splitlines()[-1])
    return {**res, **inner}


# benchmarks


def bench_cpu(
    tmp: Path, n: int, rounds: int, levels: list[int], runners: list[str] | None = None
) -> list[str]:
    """Client CPU per request at each concurrency in `levels`, counted two ways beside the
    failure rate: per attempted request (what the client did) and per succeeded one (what the
    user got). A runner that fails most of its requests at a concurrency is cheap per attempt
    and ruinous per success; dividing by successes alone once made a ratio swing from 60x to
    50,000x between rounds. regen's figures are marginal over two run sizes (ingest,
    dispatch, SQLite and export included); its attempts (retries too) come from state.db.
    `runners` leaves the others out (the openai SDK takes minutes a round at 2,000); aiohttp
    alone, the floor, always runs."""
    proc, url = start_sim(tmp, mean=50)
    names = [
        name
        for name in ("regen run", "regen client", "aiohttp alone", "openai SDK")
        if runners is None or name in runners or name == "aiohttp alone"
    ]
    cells: dict[tuple[str, int], dict[str, list[float]]] = {}
    try:
        small = max(200, n // 10)
        for _ in range(rounds):
            for level in levels:
                # Alternate the runners within each round so drift hits all of them alike.
                if "regen run" in names:
                    cpu_regen_run(cells, tmp, url, n, small, level)
                for name, kind in WORKERS:
                    if name in names:
                        cpu_worker(cells, name, kind, url, n, level)
    finally:
        proc.terminate()
        proc.wait()
    out = [
        "| runner | in flight | failed (median) | CPU ms per attempted (median; rounds) | "
        "CPU ms per succeeded (median) | per attempted, x aiohttp alone |",
        "|---|---|---|---|---|---|",
    ]
    for level in levels:
        floor = statistics.median(cells["aiohttp alone", level]["att"])
        for name in names:
            c = cells[name, level]
            att = statistics.median(c["att"])
            out.append(
                f"| {name} | {level} | {statistics.median(c['fail']):.1%} | {att:.3f}; "
                f"{', '.join(f'{v:.3f}' for v in c['att'])} | "
                f"{statistics.median(c['ok']):.3f} | {att / floor:.2f}x |"
            )
    return out


WORKERS = (("regen client", "regen"), ("aiohttp alone", "aiohttp"), ("openai SDK", "openai"))


def cpu_regen_run(
    cells: dict[tuple[str, int], dict[str, list[float]]],
    tmp: Path,
    url: str,
    n: int,
    small: int,
    level: int,
) -> None:
    big = regen_run(tmp, url, n, concurrency=level, initial=level)
    little = regen_run(tmp, url, small, concurrency=level, initial=level)
    counts = []
    for r in (big, little):
        ((att, bad),) = db(
            r["out"],
            "SELECT COUNT(*), COALESCE(SUM(failure_class IS NOT NULL), 0) FROM attempts",
        )
        ((done,),) = db(r["out"], "SELECT COUNT(*) FROM items WHERE status = 'done'")
        counts.append((att, bad, done))
    (att_b, bad_b, done_b), (att_l, _, done_l) = counts
    cpu = big["cpu_s"] - little["cpu_s"]
    c = cells.setdefault(("regen run", level), {"att": [], "ok": [], "fail": []})
    c["att"].append(cpu / max(1, att_b - att_l) * 1000)
    c["ok"].append(cpu / max(1, done_b - done_l) * 1000)
    c["fail"].append(bad_b / max(1, att_b))


def cpu_worker(
    cells: dict[tuple[str, int], dict[str, list[float]]],
    name: str,
    kind: str,
    url: str,
    n: int,
    level: int,
) -> None:
    r = worker(kind, url, n, level)
    c = cells.setdefault((name, level), {"att": [], "ok": [], "fail": []})
    c["att"].append(r["cpu_s"] / n * 1000)
    c["ok"].append(r["cpu_s"] / max(r["ok"], 1) * 1000)
    c["fail"].append(r["failed"] / n)


def bench_stream(tmp: Path, n: int, rounds: int, intervals: list[float]) -> list[str]:
    """Streams of two lengths against two simulators, for each client and read interval: the
    CPU of the long run per chunk, and the marginal CPU per chunk (long minus short run, over
    the difference in chunks), which leaves out what a request costs whatever its length.
    `aiohttp alone` reads the same streams and counts their chunks without parsing them: the
    floor under regen's client."""
    short, short_url = start_sim(tmp, time_scale=1.0, mean=100, ttft=0.1, tps=400.0)
    long, long_url = start_sim(tmp, time_scale=1.0, mean=600, ttft=0.1, tps=400.0)
    rows = []
    try:
        for interval in intervals:
            for name, kind in (
                ("regen client", "regen-stream"),
                ("aiohttp alone", "aiohttp-stream"),
            ):
                per, marginal, chunks, fails, wall = [], [], [], 0, []
                for _ in range(rounds):
                    a = worker(kind, short_url, n, 200, interval)
                    b = worker(kind, long_url, n, 200, interval)
                    per.append(b["cpu_s"] / max(b["chunks"], 1) * 1e6)
                    extra = max(b["chunks"] - a["chunks"], 1)
                    marginal.append((b["cpu_s"] - a["cpu_s"]) / extra * 1e6)
                    chunks.append(b["chunks"])
                    wall.append(b["wall_s"])
                    fails += a["failed"] + b["failed"]
                rows.append(
                    f"| {name} | {interval:g} | {statistics.median(chunks):.0f} | "
                    f"{statistics.median(wall):.1f} | {statistics.median(per):.2f} | "
                    f"{', '.join(f'{v:.2f}' for v in per)} | {statistics.median(marginal):.2f} | "
                    f"{', '.join(f'{v:.2f}' for v in marginal)} | {fails} |"
                )
    finally:
        for proc in (short, long):
            proc.terminate()
            proc.wait()
    return [
        f"{n} streams a run, 200 in flight; long runs of about 150 chunks a stream, short of 25.",
        "",
        "| client | read interval s | chunks (long run) | wall s (long run) | "
        "CPU us per chunk (long run, median) | rounds | marginal CPU us per chunk (median) | "
        "rounds | failed |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"SSE parsing alone: {assembler_us_per_chunk():.2f} us per chunk",
    ]


def assembler_us_per_chunk(n: int = 200_000) -> float:
    """CPU of regen's SSE assembler alone on a typical OpenRouter content chunk."""
    from regen.engine.client.sse import StreamAssembler

    line = (
        b'data: {"id":"gen-1-abc","provider":"Bench","model":"bench/model","created":1,'
        b'"system_fingerprint":null,"object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":" the model reads each"},'
        b'"finish_reason":null,"native_finish_reason":null,"logprobs":null}]}\n\n'
    )
    a = StreamAssembler()
    t = time.process_time()
    for _ in range(n):
        a.feed(line)
    return (time.process_time() - t) / n * 1e6


def bench_inflight(tmp: Path, n: int) -> list[str]:
    # Every answer takes 8 s, so all n requests are in flight together.
    proc, url = start_sim(tmp, time_scale=1.0, mean=20, ttft=8.0, tps=1e6)
    try:
        small = regen_run(tmp, url, 10, concurrency=10, initial=10)
        big = regen_run(tmp, url, n, concurrency=n, initial=n)
    finally:
        proc.terminate()
        proc.wait()
    log = (big["out"] / "run.log").read_text()
    peak = max(int(m) for m in re.findall(r"in_flight=(\d+)", log))
    errors = db(big["out"], "SELECT COUNT(*) FROM attempts WHERE failure_class IS NOT NULL")[0][0]
    done = db(big["out"], "SELECT COUNT(*) FROM results")[0][0]
    per = (big["maxrss_mb"] - small["maxrss_mb"]) * 1024 / n
    return [
        "| requests | peak in flight | done | failed attempts | peak RSS MB | "
        "RSS of a 10-request run MB | RSS per in-flight request KB | wall s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {n} | {peak} | {done} | {errors} | {big['maxrss_mb']:.0f} | "
        f"{small['maxrss_mb']:.0f} | {per:.1f} | {big['wall_s']:.1f} |",
    ]


def bench_capacity(tmp: Path, n: int, rounds: int) -> list[str]:
    """`n` requests; the ideal is capacity / mean latency, over the whole run (ramp-up
    included) and in steady state."""
    out = [
        "| requests | provider capacity | lane concurrency | mean latency s | ideal req/s | "
        "achieved req/s | achieved / ideal | steady state / ideal | answered 429 | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _ in range(rounds):
        proc, url = start_sim(tmp, time_scale=1.0, mean=100, ttft=0.3, tps=200.0, capacity=500)
        try:
            res = regen_run(tmp, url, n, concurrency=2000, initial=256)  # the default
        finally:
            proc.terminate()
            proc.wait()
        o = res["out"]
        (lat,) = db(o, "SELECT AVG(latency_s) FROM results")[0]
        (t0, t1) = db(o, "SELECT MIN(started_at), MAX(started_at + latency_s) FROM attempts")[0]
        (attempts, r429) = db(
            o, "SELECT COUNT(*), SUM(failure_class = 'rate_limited') FROM attempts"
        )[0]
        (failed,) = db(o, "SELECT COUNT(*) FROM items WHERE status != 'done'")[0]
        ideal = 500 / lat
        achieved = n / (t1 - t0)
        # Steady state: answers that ended between 5 s in and 2 s before the end.
        (steady,) = db(
            o,
            f"SELECT COUNT(*) FROM attempts WHERE failure_class IS NULL AND "
            f"started_at + latency_s BETWEEN {t0 + 5} AND {t1 - 2}",
        )[0]
        steady_rate = steady / (t1 - t0 - 7)
        out.append(
            f"| {n} | 500 | 2000 | {lat:.3f} | {ideal:.0f} | {achieved:.0f} | "
            f"{achieved / ideal:.1%} | {steady_rate / ideal:.1%} | "
            f"{r429 / attempts:.2%} ({r429} of {attempts}) | {failed} |"
        )
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["all", "cpu", "stream", "inflight", "capacity"])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--capacity-requests", type=int, default=30000)
    ap.add_argument(
        "--cpu-levels",
        default="256,2000",
        help="concurrencies for `cpu`: one every runner survives, and 2,000",
    )
    ap.add_argument(
        "--runners",
        help="for `cpu`: only these (comma-separated names as in its table; aiohttp alone "
        "always runs)",
    )
    ap.add_argument(
        "--read-intervals",
        default="0,0.1,0.25,1",
        help="stream read intervals to compare (comma-separated seconds)",
    )
    args = ap.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.platform()}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if args.which in ("all", "cpu"):
            levels = [int(v) for v in args.cpu_levels.split(",")]
            runners = args.runners.split(",") if args.runners else None
            table = bench_cpu(tmp, args.requests, args.rounds, levels, runners)
            print("\n## cpu\n" + "\n".join(table))
        if args.which in ("all", "stream"):
            intervals = [float(v) for v in args.read_intervals.split(",")]
            print("\n## stream\n" + "\n".join(bench_stream(tmp, 2000, args.rounds, intervals)))
        if args.which in ("all", "inflight"):
            print("\n## inflight\n" + "\n".join(bench_inflight(tmp, 10000)))
        if args.which in ("all", "capacity"):
            print(
                "\n## capacity\n"
                + "\n".join(bench_capacity(tmp, args.capacity_requests, args.rounds))
            )


if __name__ == "__main__":
    main()
