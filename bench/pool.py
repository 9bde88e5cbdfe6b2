"""Does an endpoint pool scale? The same job against one simulated vLLM server and against a
pool of three, each server generating at most `--max-num-seqs` requests at once (more wait in
its queue, as vLLM's do), so the servers, not regen, are the limit.

    .venv/bin/python bench/pool.py [--items 600] [--servers 1 3] [--max-num-seqs 32]

Prints, per pool size: wall time, answers per second, the speed-up over one server, how the
requests spread over the servers, and the peak each server had in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simproc import machine_line, start_sim  # noqa: E402

MODEL = "qwen/qwen3-8b"


def sim_toml(max_num_seqs: int) -> str:
    return (
        f'dialect = "vllm"\nserved_model = "{MODEL}"\nseed = 5\ntime_scale = 1.0\n'
        f"max_num_seqs = {max_num_seqs}\n"
    )


def stats(base_url: str) -> dict[str, Any]:
    root = base_url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/_sim/stats", timeout=10) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def one(tmp: Path, servers: int, items: int, max_num_seqs: int) -> dict[str, Any]:
    procs = [start_sim(sim_toml(max_num_seqs), tmp) for _ in range(servers)]
    try:
        data = tmp / f"chat-{servers}.jsonl"
        data.write_text(
            "".join(
                json.dumps({"messages": [{"role": "user", "content": f"Question {i}: say hi."}]})
                + "\n"
                for i in range(items)
            )
        )
        endpoints = "".join(
            f'[[endpoints]]\nname = "gpu{i}"\nbase_url = "{url}"\ndialect = "vllm"\n'
            'api_key_env = "REGEN_BENCH_NO_KEY"\ntoken_ids = true\n\n'
            for i, (_, url) in enumerate(procs)
        )
        job = tmp / f"job-{servers}.toml"
        out = tmp / f"out-{servers}"
        job.write_text(
            f'[job]\noutput_dir = "{out}"\n\n{endpoints}[generation]\nmodel = "{MODEL}"\n'
            f"max_tokens = 1024\n\n[run]\nconcurrency = {4 * max_num_seqs * servers}\n"
            f'progress_interval_s = 5\n\n[[datasets]]\nname = "chat"\npath = "{data}"\n'
        )
        env = {k: v for k, v in os.environ.items() if k != "REGEN_BENCH_NO_KEY"}
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "regen", "run", str(job)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        wall = time.monotonic() - started
        if run.returncode != 0:
            raise SystemExit(f"regen run failed ({run.returncode}): {run.stderr[-2000:]}")
        db = sqlite3.connect(out / "state.db")
        try:
            done = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        finally:
            db.close()
        per_server = [stats(url) for _, url in procs]
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(timeout=10)
    return {
        "servers": servers,
        "answers": done,
        "wall_s": round(wall, 2),
        "answers_per_s": round(done / wall, 1),
        "requests_per_server": [s["chat_requests"] for s in per_server],
        "peak_in_flight_per_server": [s["peak_in_flight"] for s in per_server],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=600)
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--max-num-seqs", type=int, default=32)
    args = ap.parse_args()
    print(machine_line())
    print(
        f"workload: {args.items} answers of {MODEL} (vLLM dialect, token ids on), each server "
        f"at most {args.max_num_seqs} at once, real-time speeds (time_scale 1)"
    )
    base: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.servers:
            r = one(Path(tmp), n, args.items, args.max_num_seqs)
            base = base or r["answers_per_s"] / n
            r["speedup_over_one"] = round(r["answers_per_s"] / base, 2)
            print(json.dumps(r))


if __name__ == "__main__":
    main()
