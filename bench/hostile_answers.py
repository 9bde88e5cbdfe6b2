"""A hostile server against `regen run`: every answer is 30 MB for max_tokens 50 (billed as
3 tokens), at 100 requests in flight. Measures the peak RSS of the regen process (target:
under 300 MB), what the server managed to send, and how the items ended.

The server is a vLLM-dialect endpoint of this script's own, run as its own process pinned to
core 0; `regen run` runs pinned to core 1, and its peak RSS and CPU are its own (fork +
wait4). Each answer's headers go out at once, its body after `--ttfb-s` (as if generated),
chunked (no Content-Length to refuse it by), whole or streamed.

    .venv/bin/python bench/hostile_answers.py [--mode whole|stream|both] [--items 400]
        [--concurrency 100] [--answer-mb 30] [--ttfb-s 1.0] [--src DIR]

`--src DIR` runs regen from another source tree (for example `git archive` of an older
commit, unpacked) to measure it side by side; by default, the one this script belongs to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PIECE = b"x" * 65536

JOB = """
[job]
output_dir = "out"

[endpoint]
base_url = "{url}"
dialect = "vllm"

[generation]
model = "bench/model"
max_tokens = 50

[run]
max_attempts = {attempts}
stop_error_rate = 1.0
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


# --- the hostile server (its own process) ---------------------------------------------------


async def serve(port_file: Path, answer_bytes: int, ttfb_s: float) -> None:
    """Answer every chat request, after `ttfb_s` (as if generating), with `answer_bytes` of
    content, whole or streamed as asked, until the client goes away; /_stats says what was
    sent."""
    from aiohttp import web

    stats = {"requests": 0, "bytes_sent": 0, "whole": 0, "in_flight": 0, "max_in_flight": 0}
    usage = b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}'

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        stats["requests"] += 1
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        stream = bool(body.get("stream"))
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream" if stream else "application/json"}
        )
        try:
            await resp.prepare(request)
            await asyncio.sleep(ttfb_s)
            if stream:
                head = b""
                piece = (
                    b'data: {"id":"gen","model":"bench/model","choices":[{"index":0,'
                    b'"delta":{"content":"' + PIECE + b'"}}]}\n\n'
                )
                tail = (
                    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
                    b'data: {"choices":[],' + usage + b"}\n\ndata: [DONE]\n\n"
                )
            else:
                head = (
                    b'{"id":"gen","model":"bench/model","choices":[{"index":0,'
                    b'"finish_reason":"stop","message":{"role":"assistant","content":"'
                )
                piece = PIECE
                tail = b'"}}],' + usage + b"}"
            sent = 0
            await resp.write(head)
            while sent < answer_bytes:
                await resp.write(piece)
                sent += len(PIECE)
                stats["bytes_sent"] += len(piece)
            await resp.write(tail)
            await resp.write_eof()
            stats["whole"] += 1
        except ConnectionError:
            pass  # the client closed the connection: what regen should do
        finally:
            stats["in_flight"] -= 1
        return resp

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/_stats", get_stats)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port_file.write_text(str(runner.addresses[0][1]))
    await asyncio.Event().wait()


def start_server(
    tmp: Path, answer_bytes: int, ttfb_s: float
) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    cmd = [sys.executable, str(HERE), "_serve", str(port_file), str(answer_bytes), str(ttfb_s)]
    proc = subprocess.Popen(["taskset", "-c", "0", *cmd])
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the hostile server did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


# --- regen against it -----------------------------------------------------------------------


def child_usage(args: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run regen pinned to core 1: its wall time, exit code, CPU seconds and peak RSS."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.chdir(cwd)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execvpe("taskset", ["taskset", "-c", "1", *args], env)
    _, status, usage = os.wait4(pid, 0)
    return {
        "wall_s": time.monotonic() - started,
        "rc": os.waitstatus_to_exitcode(status),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_mb": usage.ru_maxrss / 1024,
    }


def one_run(tmp: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    work = tmp / mode
    work.mkdir()
    with (work / "d.jsonl").open("w") as f:
        for i in range(args.items):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"q {i}"}]}) + "\n")
    server, url = start_server(tmp, args.answer_mb * 1024 * 1024, args.ttfb_s)
    try:
        (work / "job.toml").write_text(
            JOB.format(
                url=url + "/v1",
                attempts=args.max_attempts,
                concurrency=args.concurrency,
                stream="true" if mode == "stream" else "false",
            )
        )
        env = dict(os.environ)
        if args.src:
            env["PYTHONPATH"] = str(Path(args.src).resolve())
        usage = child_usage([sys.executable, "-m", "regen", "run", "job.toml"], work, env)
        with urllib.request.urlopen(url + "/_stats") as resp:
            stats = json.loads(resp.read())
    finally:
        server.terminate()
        server.wait()
    db = sqlite3.connect(work / "out" / "state.db")
    try:
        ended = db.execute(
            "SELECT status, COALESCE(failure_class, '-'), COUNT(*) FROM items GROUP BY 1, 2"
        ).fetchall()
        (stored,) = db.execute("SELECT COALESCE(MAX(LENGTH(content)), 0) FROM results").fetchone()
    finally:
        db.close()
    return {"mode": mode, **usage, **stats, "ended": ended, "longest_stored": stored}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        asyncio.run(serve(Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["whole", "stream", "both"], default="both")
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--answer-mb", type=int, default=30)
    ap.add_argument("--max-attempts", type=int, default=2)
    ap.add_argument(
        "--ttfb-s",
        type=float,
        default=1.0,
        help="the server's wait before each answer's body, as if generating (so that the "
        "requests overlap: in flight at once)",
    )
    ap.add_argument("--src", help="run regen from this source tree (PYTHONPATH)")
    args = ap.parse_args()
    print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"date: {time.strftime('%Y-%m-%d %H:%M')}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
    print(f"regen from: {args.src or HERE.parent.parent / 'src'}")
    print()
    print(
        "| answers | in flight (server) | requests | answers sent whole | MB sent | "
        "peak RSS MB | CPU s | wall s | items | longest stored |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    modes = ["whole", "stream"] if args.mode == "both" else [args.mode]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp_s:
        for mode in modes:
            r = one_run(Path(tmp_s), mode, args)
            worst = max(worst, r["maxrss_mb"])
            ended = ", ".join(f"{n} {s} ({c})" for s, c, n in r["ended"])
            print(
                f"| {mode}, {args.answer_mb} MB each | {r['max_in_flight']} | {r['requests']} | "
                f"{r['whole']} | {r['bytes_sent'] / 2**20:.0f} | {r['maxrss_mb']:.0f} | "
                f"{r['cpu_s']:.1f} | {r['wall_s']:.1f} | {ended} | {r['longest_stored']:,} |"
            )
    print()
    verdict = "under" if worst < 300 else "OVER"
    print(f"peak RSS of regen: {worst:.0f} MB ({verdict} the 300 MB target)")


if __name__ == "__main__":
    main()
