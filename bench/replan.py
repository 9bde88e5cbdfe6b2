"""A kept bench/realistic.py job planned again: from the store as its plan saw it
(`planned.db`), by the code on PYTHONPATH, against how its run ended. For trying a change to
the plan on recorded jobs without running them again.

For each job directory (`bench/realistic.py --keep DIR`: DIR/realistic-N), a simulator is
started from the kept config beside it (prices and credit are all the plan asks it), the job
is copied with its base_url pointed there and `planned.db` as its store, and `regen plan
--json` runs. Printed: the plan's count of items the job's cap leaves (and whether its stated
p10-p90 holds the run's), against those the run's closing lines put down to the cap, and per
dataset (plan / run).

Run: PYTHONPATH=src .venv/bin/python bench/replan.py DIR/realistic-*
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import simproc
from realistic import cap_unsent


def replan(job: Path) -> str:
    """One line: the plan's count against the run's, and per dataset."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        proc, url = simproc.start_sim(sorted(job.parent.glob("sim-*.toml"))[0].read_text(), tmp)
        try:
            for rows in job.glob("*.jsonl"):
                shutil.copy(rows, tmp / rows.name)
            text = (job / "job.toml").read_text()
            (tmp / "job.toml").write_text(
                re.sub(r'base_url = "[^"]*"', f'base_url = "{url}"', text)
            )
            (tmp / "out").mkdir()
            shutil.copy(job / "planned.db", tmp / "out" / "state.db")
            out = subprocess.run(
                [sys.executable, "-m", "regen", "plan", str(tmp / "job.toml"), "--json"],
                env={**os.environ, "BENCH_KEY": "sk-bench"},
                capture_output=True,
                text=True,
            )
        finally:
            proc.terminate()
            proc.wait()
    if out.returncode:
        return f"{job.name}: the plan failed: {out.stderr.strip().splitlines()[-1]}"
    plan = json.loads(out.stdout)
    said = {d["name"]: d["pending"] - d["sent"] for d in plan["datasets"]}
    left = cap_unsent(job / "out" / "run.log")
    planned, actual = plan["job"]["unsent"], sum(left.values())
    error = f"{planned / actual - 1:+.0%}" if actual else "-"
    each = " ".join(
        f"{ds} {said.get(ds, 0)}/{left.get(ds, 0)}" for ds in said if said.get(ds) or left.get(ds)
    )
    stated = re.search(r"p10-p90 (\d+)-(\d+)", plan["job"]["stop"] or "")
    held = "-" if stated is None else f"{stated[1]}-{stated[2]}"
    if stated is not None:
        held += " holds it" if int(stated[1]) <= actual <= int(stated[2]) else " misses it"
    return (
        f"{job.name}: plan {planned} (p10-p90 {held}), run {actual} ({error}); per dataset, "
        f"plan/run: {each}"
    )


def main() -> None:
    for job in map(Path, sys.argv[1:]):
        print(replan(job), flush=True)


if __name__ == "__main__":
    main()
