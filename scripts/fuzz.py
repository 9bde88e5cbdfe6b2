"""A longer fuzz run of the hostile-input property tests (docs/security.md).

The suite runs them with a bounded number of examples, the same ones every time; this runs
them with `--scale` times as many, fresh ones each run (Hypothesis, not derandomized), and
prints, per test, the inputs tried and whether anything but a row, a bad row, a result or
regen's own error came out.

    .venv/bin/python scripts/fuzz.py [--scale 100] [--tests PATH ...]

Exit status 1 when a test failed (its falsifying example is printed by pytest above).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROPERTY_TESTS = [
    "tests/sources/test_hostile_rows.py",
    "tests/engine/client/test_hostile_answers.py",
    "tests/sources/test_real_rows.py::test_no_prompt_ends_on_an_assistant_turn",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=100.0, help="times the suite's examples")
    ap.add_argument("--tests", nargs="*", default=PROPERTY_TESTS)
    args = ap.parse_args()
    env = {**os.environ, "REGEN_FUZZ_SCALE": str(args.scale)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["--hypothesis-show-statistics", "-k", "not end_to_end", *args.tests]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    # Hypothesis's statistics: a test's name line, then per phase "N passing, M failing, and
    # K invalid test cases".
    rows: list[tuple[str, int, int, int]] = []
    name = "?"
    for line in proc.stdout.splitlines():
        head = re.match(r"^(\S+::\S+):$", line.strip())
        if head:
            name = head.group(1)
            continue
        m = re.search(r"(\d+) passing, (\d+) failing, and (\d+) invalid test cases", line)
        if m:
            rows.append((name, int(m[1]), int(m[2]), int(m[3])))
    print(f"fuzz run, {args.scale:g} x the suite's examples, {took:.0f} s")
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.machine()}, nproc {os.cpu_count()}")
    print()
    print("| test | inputs tried | failing | invalid (filtered) |")
    print("| --- | --- | --- | --- |")
    for test, ok, bad, invalid in rows:
        print(f"| `{test.split('::')[-1]}` | {ok + bad:,} | {bad} | {invalid:,} |")
    tried = sum(r[1] + r[2] for r in rows)
    failing = sum(r[2] for r in rows)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"\ntotal: {tried:,} inputs, {failing} failing; pytest: {summary}")
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        print(proc.stderr[-2000:], file=sys.stderr)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
