"""A torture run: kill `regen run` with SIGKILL again and again, rerun it at once, and then check
that nothing was lost, nothing was paid or written twice, the dollar cap held, and whatever is
left unsent is listed with its reason.

The simulator (in this process, so that it outlives every kill) answers with faults on: 429s
above a capacity, 5xx, stalls, cut connections, mid-stream errors and HTTP 200 error bodies; it
bills an answer when its generation ends, whether or not the client is still there (as
OpenRouter does). The job has a non-streamed short lane that escalates to a streamed long
lane, an each-turn dataset, a sequential one, a token budget and a job dollar cap.

Each kill lands at a named moment: during start-up (before the first answer), during dispatch
(after a seeded number of answers), at a dataset boundary (once the second dataset's first
answer is in) and, last, in the export (once dispatch has written its reconciliation line).

    .venv/bin/python bench/torture.py [--kills 24] [--seed 1] [--rows 2400] [--json]

Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults

KEY = "sk-torture-not-a-secret"
MOMENTS = ("start-up", "dispatch", "dataset boundary", "export")


def rows(tmp: Path, n: int) -> None:
    """Three sources: single questions (token budget), two-turn chats (each turn), and
    three-turn chats (sequential)."""

    def chat(i: int, turns: int, tag: str) -> dict[str, Any]:
        msgs = []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"{tag} {i} turn {t}: explain step {t}."})
            msgs.append({"role": "assistant", "content": f"old answer {t}"})
        return {"messages": msgs}

    for name, turns, count in (("single", 1, n), ("each", 2, n // 3), ("seq", 3, n // 4)):
        with (tmp / f"{name}.jsonl").open("w") as f:
            for i in range(count):
                f.write(json.dumps(chat(i, turns, name)) + "\n")


def job_text(tmp: Path, base_url: str, cap: float, budget: int) -> str:
    return f"""
[job]
name = "torture"
output_dir = "{tmp / "out"}"

[endpoint]
base_url = "{base_url}"
api_key_env = "TORTURE_KEY"

[generation]
model = "moonshotai/kimi-k2.5"
max_tokens = 1024

[run]
initial_limit = 64
idle_timeout_s = 1.0
timeout_s = 8
max_attempts = 6
stop_grace_s = 5
progress_interval_s = 1

[budget]
max_cost_usd = {cap}

[[lanes]]
name = "short"
concurrency = 64
max_tokens = 256
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 48
max_tokens = 1024
stream = true

[[datasets]]
name = "single"
path = "{tmp / "single.jsonl"}"
token_budget = {budget}

[[datasets]]
name = "each"
path = "{tmp / "each.jsonl"}"
mode = "each_turn"

[[datasets]]
name = "seq"
path = "{tmp / "seq.jsonl"}"
mode = "sequential"
"""


def sim_config(seed: int) -> SimConfig:
    faults = SimFaults(
        http_5xx=0.03,
        http_5xx_codes=[500, 502, 503],
        stall=0.01,
        stall_s=3.0,
        reset=0.01,
        midstream_error=0.01,
        error_200=0.01,
    )
    base = SimConfig(seed=seed, time_scale=0.05, faults=faults)
    # One provider endpoint with a capacity below the lanes' concurrency: 429s.
    model = base.models[0]
    endpoint = model.endpoints[0].model_copy(update={"capacity": 80})
    models = [model.model_copy(update={"endpoints": [endpoint]}), *base.models[1:]]
    return base.model_copy(update={"models": models})


class Watch:
    """Read-only views of the run's output folder, as another process would."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            db = sqlite3.connect(f"file:{self.out / 'state.db'}?mode=ro", uri=True, timeout=5)
        except sqlite3.Error:
            return []
        try:
            return db.execute(sql).fetchall()
        except sqlite3.Error:
            return []
        finally:
            db.close()

    def ledger(self) -> float:
        got = self.query("SELECT COALESCE(SUM(cost_usd), 0) FROM ledger")
        return float(got[0][0]) if got else 0.0

    def answers(self) -> int:
        got = self.query("SELECT COUNT(*) FROM results")
        return int(got[0][0]) if got else 0

    def second_dataset_started(self) -> bool:
        """The first dataset is done or its budget met, and the next one's answers come in."""
        got = self.query("SELECT COUNT(*) FROM results WHERE dataset != 'single'")
        return bool(got) and got[0][0] > 0

    def log_lines(self) -> int:
        """Reconciliation lines in run.log: dispatch writes one just before the export."""
        log = self.out / "run.log"
        try:
            return log.read_bytes().count(b"Z reconcile ")
        except OSError:
            return 0


def run_once(
    job: Path, env: dict[str, str], watch: Watch, moment: str | None, rng: random.Random
) -> tuple[int, str]:
    """Run `regen run`; kill it with SIGKILL at `moment` (None: let it finish). Returns its
    exit code (-9 when killed) and its output."""
    log = job.parent / f"run-{time.monotonic_ns()}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "regen", "run", str(job)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        before, reconciles = watch.answers(), watch.log_lines()
        started = time.monotonic()
        target = before + rng.randint(10, 120)
        startup_s = rng.uniform(0.2, 1.5)
        while proc.poll() is None and moment is not None:
            if moment == "start-up" and time.monotonic() - started >= startup_s:
                break
            if moment == "dispatch" and watch.answers() >= target:
                break
            if moment == "dataset boundary" and watch.second_dataset_started():
                break
            if moment == "export" and watch.log_lines() > reconciles:
                break
            if time.monotonic() - started > 120:
                break
            # The export follows the reconciliation line within milliseconds: look closely.
            time.sleep(0.0005 if moment == "export" else 0.01)
        if proc.poll() is None and moment is not None:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait()
    return code, log.read_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=2400)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    env = {**os.environ, "TORTURE_KEY": KEY}
    report: dict[str, Any] = {"kills": [], "reruns": []}
    with tempfile.TemporaryDirectory() as tmp_name, sim_in_thread(sim_config(args.seed)) as sim:
        tmp = Path(tmp_name)
        rows(tmp, args.rows)
        cap, budget = 6.0, 60_000
        job = tmp / "job.toml"
        job.write_text(job_text(tmp, sim.base_url, cap, budget))
        watch = Watch(tmp / "out")
        highest = 0.0
        moments: Counter[str] = Counter()
        # The second kill at the first dataset boundary, the last in the export (the run gets
        # there only at the end of its dispatch), the others at start-up or in dispatch.
        plan = ["start-up", "dataset boundary"]
        plan += rng.choices(MOMENTS[:2], weights=(1, 3), k=max(0, args.kills - 3)) + ["export"]
        for moment in plan:
            if moment == "dataset boundary" and watch.second_dataset_started():
                moment = "dispatch"  # the boundary is behind: kill in dispatch instead
            code, text = run_once(job, env, watch, moment, rng)
            billed = sim.simulator.billed_usd()
            highest = max(highest, billed)
            ledger = watch.ledger()
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            report["kills"].append(
                {
                    "moment": moment,
                    "exit": code,
                    "billed_usd": billed,
                    "ledger_usd": ledger,
                    "error": errors[-1] if errors else None,
                }
            )
            if code == -signal.SIGKILL:
                moments[moment] += 1
            elif code in (0, 3, 4):
                break  # the job ended before the kill: the job is smaller than the kills
        # Rerun the same command until it ends with nothing left to send (0, 3) or at the cap.
        for _ in range(10):
            code, text = run_once(job, env, watch, None, rng)
            report["reruns"].append(code)
            if code != 5:
                break
        sim.simulator.wait_billed(120)  # the last generations end and are billed
        billed = sim.simulator.billed_usd()
        highest = max(highest, billed)
        status = dict(watch.query("SELECT status, COUNT(*) FROM items GROUP BY status"))
        total = sum(status.values())
        ledger = watch.ledger()
        dup_results = watch.query("SELECT COUNT(*) - COUNT(DISTINCT item_id) FROM results")[0][0]
        done_results = watch.query("SELECT COUNT(*) FROM results")[0][0]
        export_ids: list[str] = []
        for f in sorted((tmp / "out" / "export").glob("*.jsonl")):
            export_ids += [json.loads(line)["id"] for line in f.read_text().splitlines()]
        unsent = [
            (m[1], int(m[2]), m[3])
            for m in re.finditer(r"dataset (\S+): (\d+) items not sent: (.+)", text)
        ]
        left = status.get("pending", 0)
        listed = sum(n for _, n, _ in unsent)
        chat = sim.simulator.chat_log()
        report.update(
            kills_at=dict(moments),
            items=total,
            by_status=status,
            lost=total - status.get("done", 0) - status.get("failed", 0) - listed,
            results_duplicated=dup_results,
            export_rows=len(export_ids),
            export_rows_duplicated=len(export_ids) - len(set(export_ids)),
            export_rows_missing=done_results - len(set(export_ids)),
            ledger_usd=round(ledger, 6),
            billed_usd=round(billed, 6),
            billed_not_in_ledger_usd=round(billed - ledger, 6),
            highest_billed_usd=round(highest, 6),
            cap_usd=cap,
            pending=left,
            unsent_listed=unsent,
            final_exit=report["reruns"][-1] if report["reruns"] else None,
            requests=len(chat),
            statuses=dict(Counter(e.status for e in chat)),
            faults=dict(Counter(f for e in chat for f in e.faults)),
        )
    failures = []
    if sum(moments.values()) < min(args.kills, 20):
        failures.append(f"only {sum(moments.values())} kills landed")
    if report["lost"] != 0:
        failures.append(f"{report['lost']} items neither done, failed nor listed as unsent")
    if report["results_duplicated"] or report["export_rows_duplicated"]:
        failures.append("an answer or an export row is there twice")
    if report["export_rows_missing"]:
        failures.append(f"{report['export_rows_missing']} answers are missing from the export")
    if report["highest_billed_usd"] > cap + 1e-9:
        failures.append(f"billed ${report['highest_billed_usd']:.4f} over the ${cap} cap")
    if left != listed:
        failures.append(f"{left} items pending but {listed} listed as not sent")
    report["failures"] = failures
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for k in report["kills"]:
            print(
                f"kill at {k['moment']:<16} exit {k['exit']:>3}  billed ${k['billed_usd']:.4f}"
                f"  ledger ${k['ledger_usd']:.4f}" + (f"  {k['error']}" if k["error"] else "")
            )
        for key in (
            "kills_at", "reruns", "items", "by_status", "lost", "results_duplicated",
            "export_rows", "export_rows_duplicated", "export_rows_missing", "ledger_usd",
            "billed_usd", "billed_not_in_ledger_usd", "highest_billed_usd", "cap_usd",
            "pending", "unsent_listed", "final_exit", "requests", "statuses", "faults",
        ):  # fmt: skip
            print(f"{key}: {report[key]}")
        print("checks: " + ("all passed" if not failures else "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
