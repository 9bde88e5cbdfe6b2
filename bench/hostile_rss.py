"""Peak memory of reading hostile files: one line of 1 GB, and millions of lines of garbage.

- read: a JSONL file whose second line is one JSON row of --line-gb GB (a single string),
  between normal chat rows, read through regen's readers (`read_rows`) in a child process;
- inspect: `regen inspect` on a job whose dataset is that file (it reads the source only);
- ingest: a JSONL file of --garbage-lines lines of binary garbage, then a few chat rows, read
  into a new state.db by `ingest()` in a child process; state.db's size after.

Each child's peak RSS is its own (os.wait4's rusage for that child). Files are written as a
stream, in chunks, into a temporary folder removed at the end (--tmp picks where: the big file
needs --line-gb of free disk). Target (issue: nothing a file sends can exhaust regen): the
1 GB line read in under 300 MB of RSS.

Run: .venv/bin/python bench/hostile_rss.py [--line-gb 1] [--garbage-lines 4000000]
     [--src DIR] [--tmp DIR]
--src reads with another tree's regen (its src folder), to compare before and after:
    git worktree add /tmp/base HEAD && .venv/bin/python bench/hostile_rss.py --src /tmp/base/src
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}

READ = """
import json, sys, time
from regen.sources import read_rows
rows, bad = 0, []
try:
    for i, row in read_rows(sys.argv[1]):
        if isinstance(row, str):
            bad.append(f"row {i}: {row[:80]}")
        else:
            rows += 1
    print(json.dumps({"result": f"{rows} rows; bad: {'; '.join(bad) or 'none'}"}))
except BaseException as exc:
    print(json.dumps({"result": f"raised {type(exc).__name__}: {str(exc)[:120]}"}))
"""

INGEST = """
import json, sys
from regen.config import load_job
from regen.sources.ingest import ingest
from regen.state.db import Store
job = load_job(sys.argv[1])
store = Store.open(job.output_path)
try:
    ingest(store, job)
    rows = store._db.execute("SELECT COUNT(*) FROM bad_rows").fetchone()[0]
    total = store._db.execute("SELECT SUM(bad_rows) FROM datasets").fetchone()[0]
    print(json.dumps({"result": f"{total:,} bad rows counted, {rows:,} kept"}))
except BaseException as exc:
    print(json.dumps({"result": f"raised {type(exc).__name__}: {str(exc)[:120]}"}))
finally:
    store.close()
"""

JOB = """
[job]
output_dir = "out"
[endpoint]
base_url = "http://127.0.0.1:9/v1"
[generation]
model = "m"
[[datasets]]
name = "d"
path = "{path}"
format = "openai"
"""


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run a child to its end: its own peak RSS (MB, from os.wait4), wall seconds, and its
    last line of output (or of errors)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        lines = [line.strip() for line in out.read().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    try:
        said = json.loads(last)
    except ValueError:
        said = None
    if isinstance(said, dict) and "result" in said:
        last = str(said["result"])
    elif isinstance(said, dict) and "rows" in said:  # regen inspect --json
        shown = [f"row {r['row_index']}: {r.get('reason') or 'ok'}" for r in said["rows"]]
        last = f"exit {proc.returncode}; " + "; ".join(shown)
    else:
        last = f"exit {proc.returncode}: {last[:160]}"
    return usage.ru_maxrss / 1024, wall, last  # ru_maxrss is in KiB on Linux


def write_long_line(path: Path, size: int) -> None:
    """A chat row, one row whose content is `size` bytes, and two more chat rows."""
    chunk = b"x" * 2**20
    with path.open("wb") as f:
        f.write(json.dumps(CHAT).encode() + b"\n")
        f.write(b'{"messages": [{"role": "user", "content": "')
        left = size
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        f.write(b'"}]}\n')
        f.write((json.dumps(CHAT) + "\n").encode() * 2)


def write_garbage(path: Path, lines: int) -> None:
    line = bytes(range(0x80, 0x90)) + b" not json \x00\n"
    with path.open("wb") as f:
        for start in range(0, lines, 100_000):
            f.write(line * min(100_000, lines - start))
        f.write((json.dumps(CHAT) + "\n").encode() * 3)


def machine() -> str:
    mem = ""
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal:"):
                mem = f", {int(row.split()[1]) / 2**20:.1f} GiB RAM"
    except OSError:
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.platform()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line-gb", type=float, default=1.0, help="size of the long line, GB")
    ap.add_argument("--garbage-lines", type=int, default=4_000_000)
    ap.add_argument("--src", default=None, help="another tree's src folder to read with")
    ap.add_argument("--tmp", default=None, help="where the temporary files go")
    ap.add_argument("--no-inspect", action="store_true", help="skip `regen inspect`")
    args = ap.parse_args()
    env = dict(os.environ)
    src = Path(args.src).resolve() if args.src else Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = str(src)
    py = sys.executable
    results: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="regen-hostile-", dir=args.tmp) as t:
        tmp = Path(t)
        long_line = tmp / "long.jsonl"
        size = int(args.line_gb * 1e9)
        write_long_line(long_line, size)
        what = f"read a {size / 1e9:.2f} GB line (read_rows)"
        results.append((what, *run_measured([py, "-c", READ, str(long_line)], env)))
        if not args.no_inspect:
            (tmp / "inspect").mkdir()
            job = tmp / "inspect" / "job.toml"
            job.write_text(JOB.format(path=long_line))
            argv = [py, "-m", "regen", "inspect", str(job), "--dataset", "d", "--rows", "4"]
            rss, wall, last = run_measured([*argv, "--json"], env)
            results.append(("regen inspect on that file", rss, wall, last))
        long_line.unlink()
        garbage = tmp / "garbage.jsonl"
        write_garbage(garbage, args.garbage_lines)
        (tmp / "ingest").mkdir()
        job = tmp / "ingest" / "job.toml"
        job.write_text(JOB.format(path=garbage))
        rss, wall, last = run_measured([py, "-c", INGEST, str(job)], env)
        db = sum(f.stat().st_size for f in (tmp / "ingest" / "out").glob("state.db*"))
        last += f"; state.db {db / 1e6:.1f} MB"
        results.append((f"ingest {args.garbage_lines:,} garbage lines", rss, wall, last))
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    print(f"machine: {machine()}")
    print(f"regen from: {src}")
    print()
    print("| what | peak RSS (MB) | wall (s) | result |")
    print("|---|---|---|---|")
    for what, rss, wall, last in results:
        print(f"| {what} | {rss:.0f} | {wall:.1f} | {last} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
