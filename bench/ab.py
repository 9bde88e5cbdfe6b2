"""`regen run`'s client CPU per request from two source trees, alternated in one invocation: what
a change costs, measured side by side against the same simulator process.

    git worktree add /tmp/base HEAD~3        # the tree to compare with
    .venv/bin/python bench/ab.py --a /tmp/base/src --b src --rounds 6 --concurrency 256

Each round runs both trees (in alternating order) on a 20,000-request job and on a 2,000-request
one, and takes the difference of their CPU over the difference of their requests: the marginal
CPU of a request, with start-up, ingest and export left out. The simulator (this tree's) runs
as its own process pinned to core 0, each client pinned to core 1 (bench/engine.py's setup).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

import engine


def marginal_ms(src: str, tmp: Path, url: str, n: int, small: int, concurrency: int) -> float:
    os.environ["PYTHONPATH"] = str(Path(src).resolve())
    big = engine.regen_run(tmp, url, n, concurrency=concurrency, initial=concurrency)
    little = engine.regen_run(tmp, url, small, concurrency=concurrency, initial=concurrency)
    return float((big["cpu_s"] - little["cpu_s"]) / (n - small) * 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first tree's src folder")
    ap.add_argument("--b", required=True, help="the second tree's src folder")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=20_000)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        sim, url = engine.start_sim(tmp)
        try:
            for r in range(args.rounds):
                for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    src = args.a if name == "a" else args.b
                    ms = marginal_ms(src, tmp, url, args.requests, 2000, args.concurrency)
                    runs[name].append(ms)
        finally:
            sim.terminate()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print("| tree | in flight | CPU ms per request (median) | rounds |")
    print("|---|---|---|---|")
    for name in ("a", "b"):
        xs = runs[name]
        rounds = ", ".join(f"{x:.3f}" for x in xs)
        src = args.a if name == "a" else args.b
        print(f"| {src} | {args.concurrency} | {statistics.median(xs):.3f} | {rounds} |")
    a, b = statistics.median(runs["a"]), statistics.median(runs["b"])
    print(f"b / a: {b / a:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
