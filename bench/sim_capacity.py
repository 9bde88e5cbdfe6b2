"""How many requests per second the simulator serves on one core.

The simulator runs as `regen sim` pinned to core 0; this script, the load generator (plain
aiohttp, `--concurrency` requests in flight), runs pinned to core 1. With time_scale 0 the
simulator answers as fast as it can, so the rate it reaches is its capacity: the client
benchmarks stay valid while they ask for less than that.

Run: .venv/bin/python bench/sim_capacity.py [--requests 20000] [--concurrency 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import simproc

SIM_TOML = """
seed = 1
time_scale = 0.0

[faults]
padding = 0.1
keepalive = 0.5

[[models]]
id = "bench/model"
mean_completion_tokens = {mean}

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
prompt_price = 1e-7
completion_price = 1e-6
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_sim(mean: int, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    return simproc.start_sim(SIM_TOML.format(mean=mean), tmp)


async def load(url: str, n: int, concurrency: int, stream: bool) -> tuple[float, int, int]:
    sem = asyncio.Semaphore(concurrency)
    ok = failed = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Authorization": "Bearer bench"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as s:

        async def one(i: int) -> None:
            nonlocal ok, failed
            body = {
                "model": "bench/model",
                "max_tokens": 4096,
                "stream": stream,
                "messages": [{"role": "user", "content": f"request {i}"}],
            }
            async with sem:
                try:
                    async with s.post(f"{url}/chat/completions", json=body) as r:
                        await r.read()
                        ok += r.status == 200
                        failed += r.status != 200
                except aiohttp.ClientError:
                    failed += 1

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.monotonic() - started, ok, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=2000)
    args = ap.parse_args()
    os.sched_setaffinity(0, {1})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mean, stream in ((50, False), (300, False), (300, True)):
            proc, url = start_sim(mean, Path(tmp))
            try:
                asyncio.run(load(url, 500, 200, stream))  # warm up
                cpu0 = cpu_seconds(proc.pid)
                wall, ok, failed = asyncio.run(load(url, args.requests, args.concurrency, stream))
                cpu = cpu_seconds(proc.pid) - cpu0
            finally:
                proc.terminate()
                proc.wait()
            rows.append(
                {
                    "mean_completion_tokens": mean,
                    "stream": stream,
                    "requests": args.requests,
                    "concurrency": args.concurrency,
                    "ok": ok,
                    "failed": failed,
                    "wall_s": round(wall, 2),
                    "req_per_s": round(ok / wall),
                    "sim_cpu_s": round(cpu, 2),
                    "sim_cpu_ms_per_req": round(cpu / max(ok, 1) * 1000, 3),
                    "sim_core_busy": round(cpu / wall, 2),
                }
            )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.platform()}"
    )
    print(
        "| mean completion tokens | stream | requests | in flight | ok | failed | wall s "
        "| req/s | sim CPU ms/req | sim core busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mean_completion_tokens']} | {r['stream']} | {r['requests']} | "
            f"{r['concurrency']} | {r['ok']} | {r['failed']} | {r['wall_s']} | "
            f"{r['req_per_s']} | {r['sim_cpu_ms_per_req']} | {r['sim_core_busy']} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
