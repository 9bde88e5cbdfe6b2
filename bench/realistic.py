"""A job as a new user would run it (issue 47): is the ETA honest, and the plan, on a realistic
job rather than on bench/plan.py's uniform workloads?

The job: datasets in the shapes of the seed datasets, built from the readers' real-row fixtures
(tests/sources/fixtures/real/): glaive function calling in `each_turn`, LLaMA-Factory's glaive
tool-call rows, multi-turn ShareGPT in `each_turn`, UltraChat, SWE-agent trajectories in
`each_turn` (one request per agent step), and code and math-reasoning questions as OpenAI
messages. Each real row is repeated with its first user turn prefixed by a tag and filler words
of random length (the simulator's answer lengths follow prompt length). Two lanes: a short one
(max_tokens 300) escalating truncated answers to a long one fed only by them. One dataset has a
token budget met mid-run; the job's dollar cap is a share (`--cap-share`) of what the plan
without a pilot expects, so that it binds. The simulator speaks OpenRouter's dialect, with
faults. The run is killed (SIGKILL) when `--kill-at` of the items are done, and run again until
it ends (finished, or exit 4: the cap).

Measured, per seed: the ETA each run's progress lines showed (eta_s, eta_p10_s, eta_p90_s,
eta_basis) at 10% and 50% of the job's items and at the first line with an ETA after each
restart, against the time then actually left (the job's end minus then, less the seconds between
a kill and the next start, which no ETA can know); and `regen plan --json` (no pilot) against
the actual cost, wall time and ending. The plan: a pilot of `--pilot` items per dataset
without a cap, whose cost (times `--cap-share`) sets the cap; then `regen plan --pilot 0
--json` on the capped job, what the user sees before `regen run`.

With `--pool N` the job runs on N self-hosted servers (vLLM's dialect, `--seqs` generated at
once each; nothing billed, so no dollar cap) and the last of them dies (SIGKILL, never back)
once `--die-at` of the items are done: the ETA is also checked at the first line after that.

Run: .venv/bin/python bench/realistic.py [--rows-scale 1] [--time-scale 0.5] [--pilot 30]
     [--seeds 1] [--first-seed 1] [--kill-at 0.3] [--cap-share 0.85] [--pool 3 [--seqs 30]
     [--die-at 0.5]] [--keep DIR] [--json FILE]
     [--lock /tmp/bench.lock]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import simproc
from plan import held, interval

REAL = Path(__file__).resolve().parent.parent / "tests" / "sources" / "fixtures" / "real"

SIM_TOML = """
seed = {seed}
time_scale = {time_scale}
retry_after_s = 0.2

[faults]
padding = 0.1
keepalive = 0.5
http_5xx = 0.02
http_408 = 0.01
reset = 0.01
error_200 = 0.005

[[models]]
id = "bench/model"
mean_completion_tokens = 150

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.3
tokens_per_s = 100
prompt_price = 0.0000006
completion_price = 0.0000025
"""

POOL_SIM_TOML = """
dialect = "vllm"
served_model = "bench/model"
max_num_seqs = {seqs}
seed = {seed}
time_scale = {time_scale}

[faults]
http_5xx = 0.02
reset = 0.01

[[models]]
id = "bench/model"
mean_completion_tokens = 150

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.3
tokens_per_s = 100
"""
"""One server of a pool (`--pool N`): vLLM's dialect, `max_num_seqs` generated at once (the
pool's N x seqs is about the lanes' 80 requests: one server gone, the others queue)."""

JOB_TOML = """
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "BENCH_KEY"

[generation]
model = "bench/model"
max_tokens = 4000

[run]
concurrency = 64
initial_limit = 64
progress_interval_s = 1
shuffle_seed = {seed}

[budget]
max_cost_usd = {cap}

[[lanes]]
name = "short"
concurrency = 64
max_tokens = 300
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 16
max_tokens = 4000
"""


def filler(rng: random.Random) -> str:
    """Words of a skewed length: most prompts short, a few long (answers follow)."""
    k = min(400, int(rng.lognormvariate(2.5, 1.2)))
    return " ".join(rng.choices(simproc.FILLER, k=k))


def tag_text(text: str, i: int, rng: random.Random) -> str:
    return f"[{i}] {filler(rng)}\n{text}"


def glaive(n: int, rng: random.Random) -> list[Any]:
    base = json.loads((REAL / "glaive.json").read_text())
    out = []
    for i in range(n):
        row = dict(rng.choice(base))
        row["chat"] = row["chat"].replace("USER: ", "USER: " + tag_text("", i, rng), 1)
        out.append(row)
    return out


def sharegpt(name: str, n: int, rng: random.Random) -> list[Any]:
    base = json.loads((REAL / name).read_text())
    out = []
    for i in range(n):
        row = json.loads(json.dumps(rng.choice(base)))
        turn = row["conversations"][0]
        turn["value"] = tag_text(turn["value"], i, rng)
        row.pop("id", None)
        out.append(row)
    return out


def ultrachat(n: int, rng: random.Random) -> list[Any]:
    (base,) = [
        json.loads(line) for line in (REAL / "ultrachat_200k.jsonl").read_text().split("\n") if line
    ]
    out = []
    for i in range(n):
        row = json.loads(json.dumps(base))
        row["prompt"] = tag_text(row["prompt"], i, rng)
        row["messages"][0]["content"] = row["prompt"]
        row["prompt_id"] = f"p{i}"
        out.append(row)
    return out


def swe_agent(n: int, rng: random.Random) -> list[Any]:
    (base,) = [
        json.loads(line) for line in (REAL / "swe_agent_traj.jsonl").read_text().split("\n") if line
    ]
    out = []
    for i in range(n):
        row = json.loads(json.dumps(base))
        row["instance_id"] = f"{base['instance_id']}-{i}"
        for m in row["history"]:
            if m["role"] == "user":
                part = m["content"][0] if isinstance(m["content"], list) else m
                key = "text" if isinstance(m["content"], list) else "content"
                part[key] = tag_text(part[key], i, rng)
                break
        out.append(row)
    return out


def questions(kind: str, n: int, rng: random.Random) -> list[Any]:
    """Code tasks or math problems as OpenAI messages (no real rows of these could be found)."""
    out = []
    for i in range(n):
        if kind == "code":
            text = f"Write a Python function for task {i}: {filler(rng)}. Explain the code."
        else:
            text = f"Problem {i}: prove step by step, then give the answer: {filler(rng)}"
        out.append({"messages": [{"role": "user", "content": text}]})
    return out


DATASETS: list[tuple[str, str, str, Callable[[int, random.Random], list[Any]], int, str]] = [
    # name, format, mode, rows, base row count, extra settings
    ("B1-glaive", "glaive", "each_turn", glaive, 150, ""),
    (
        "B2-toolcall",
        "sharegpt",
        "",
        lambda n, r: sharegpt("glaive_toolcall_en.json", n, r),
        300,
        "",
    ),
    ("B3-code", "openai", "", lambda n, r: questions("code", n, r), 600, ""),
    ("B4-math", "openai", "", lambda n, r: questions("math", n, r), 600, "token_budget = 60_000"),
    ("B6-ultrachat", "ultrachat", "", ultrachat, 500, ""),
    ("B7-sharegpt", "sharegpt", "each_turn", lambda n, r: sharegpt("sharegpt.json", n, r), 60, ""),
    ("B8-swe", "swe_agent", "each_turn", swe_agent, 8, ""),
]


def pool_job(text: str, urls: list[str]) -> str:
    """The job on a pool of self-hosted servers: one [[endpoints]] entry each, no dollar cap
    (nothing is billed)."""
    text = re.sub(r"\[endpoint\]\nbase_url = \S+\napi_key_env = \S+\n", "", text)
    text = re.sub(r"\[budget\]\nmax_cost_usd = \S+\n", "", text)
    pool = "".join(
        f'[[endpoints]]\nname = "gpu{i}"\nbase_url = "{url}"\ndialect = "vllm"\n'
        'api_key_env = "BENCH_KEY"\n\n'
        for i, url in enumerate(urls)
    )
    return pool + text


def write_job(
    work: Path, base_url: str, seed: int, scale: float, cap: float, pool: list[str] | None = None
) -> Path:
    rng = random.Random(seed)
    blocks = ""
    for name, fmt, mode, make, n, extra in DATASETS:
        rows = make(max(1, round(n * scale)), rng)
        path = work / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        blocks += f'\n[[datasets]]\nname = "{name}"\npath = "{path.name}"\nformat = "{fmt}"\n'
        blocks += (f'mode = "{mode}"\n' if mode else "") + (extra + "\n" if extra else "")
    job = work / "job.toml"
    text = JOB_TOML.format(base_url=base_url, seed=seed, cap=f"{cap:.4f}") + blocks
    job.write_text(pool_job(text, pool) if pool else text)
    return job


def run_lines(log: Path) -> list[list[tuple[float, dict[str, str]]]]:
    """Each run's progress lines in run.log, as (unix time, fields): a run starts with the
    lines that say where each dataset stands."""
    runs: list[list[tuple[float, dict[str, str]]]] = []
    fresh = True
    for line in log.read_text().splitlines():
        stamp, _, rest = line.partition(" progress ")
        if rest:
            if fresh:
                runs.append([])
                fresh = False
            t = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            runs[-1].append((t, dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)))
        elif re.match(r"\S+ dataset \S+: ", line):
            fresh = True
    return runs


def cap_unsent(log: Path) -> dict[str, int]:
    """Per dataset, the items the last run's closing lines put down to the job's dollar cap
    (`dataset B3-code: 33 items not sent: the job's dollar cap ...`): what the plan's count
    of items left unsent stands for (a dataset's own budget leaves its own, said apart)."""
    out: dict[str, int] = {}
    for line in log.read_text().splitlines():
        if " progress " in line:
            out = {}  # only the lines after the last progress line: how the last run ended
            continue
        m = re.match(r"\S+ dataset (\S+): (\d+) items not sent: the job's dollar cap", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def done_share(f: dict[str, str]) -> float:
    done, total = f["done"].split("/")
    return (int(done) + int(f.get("failed", "0"))) / max(1, int(total))


def regen_cmd() -> list[str]:
    return ["taskset", "-c", "1", sys.executable, "-m", "regen"]


def run_until_end(
    job: Path, env: dict[str, str], kill_at: float, watch: Callable[[float], None] | None = None
) -> tuple[list[int], list[float]]:
    """Run the job, SIGKILL the first run once `kill_at` of its items are done, then run again
    until it ends; the exit codes and when each kill was seen (unix time). `watch` is called
    with the share of the job's items done, at each look."""
    codes: list[int] = []
    kills: list[float] = []
    log = job.parent / "out" / "run.log"
    for attempt in range(4):
        before = len(run_lines(log)) if log.exists() else 0  # a pilot's runs come first
        proc = subprocess.Popen([*regen_cmd(), "run", str(job)], env=env, stdout=subprocess.DEVNULL)
        killed = False
        while proc.poll() is None:
            time.sleep(0.5)
            if not log.exists():
                continue
            runs = run_lines(log)
            if watch is not None and len(runs) > before and runs[-1]:
                watch(done_share(runs[-1][-1][1]))
            if attempt or kill_at <= 0:
                continue
            if len(runs) > before and runs[-1] and done_share(runs[-1][-1][1]) >= kill_at:
                proc.send_signal(signal.SIGKILL)
                killed = True
        codes.append(proc.wait())
        if not killed and codes[-1] in (0, 4):
            break
        kills.append(time.time())
    return codes, kills


def eta_point(
    lines: list[tuple[float, dict[str, str]]],
    end: float,
    reached: Callable[[float, dict[str, str]], bool],
) -> dict[str, Any] | None:
    for t, f in lines:
        if reached(t, f) and f.get("eta_s", "-") != "-":
            return {
                "eta": float(f["eta_s"]),
                "p10": float(f["eta_p10_s"]),
                "p90": float(f["eta_p90_s"]),
                "left": end - t,
                "prior": f.get("eta_basis") == "prior",
                "held": "held_until" in f,
                # Per lane: its ETA and requests on the wire (what drives a miss).
                "lanes": {
                    k: v
                    for k, v in f.items()
                    if k.startswith("lane_")
                    or (k.startswith("eta_") and k.count("_") == 2)
                    and k not in ("eta_p10_s", "eta_p90_s")
                },
            }
    return None


def one(seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    sims = [
        simproc.start_sim(
            POOL_SIM_TOML.format(seed=seed + i, time_scale=args.time_scale, seqs=args.seqs)
            if args.pool
            else SIM_TOML.format(seed=seed, time_scale=args.time_scale),
            tmp,
        )
        for i in range(max(1, args.pool))
    ]
    base_url = sims[0][1]
    pool = [url for _, url in sims] if args.pool else None
    work = tmp / f"realistic-{seed}"
    work.mkdir(parents=True)
    env = {**os.environ, "BENCH_KEY": "sk-bench"}
    died: list[float] = []

    def watch(share: float) -> None:
        # One server of the pool dies (SIGKILL, never back) once `--die-at` of the items are done.
        if args.pool and not died and share >= args.die_at:
            sims[-1][0].kill()
            died.append(time.time())

    try:
        # The plan without a cap first (what the whole job would cost), then the cap as a share.
        job = write_job(work, base_url, seed, args.rows_scale, 1e6, pool)
        free = plan_json(job, env, args.pilot)
        # How late the (first) simulator's answers were for its own work, in the pilot and
        # after: a pool's last server is killed mid-run.
        late = [simproc.late(base_url)]
        cap = interval(free["job"]["cost_usd"])[0] * args.cap_share
        job = write_job(work, base_url, seed, args.rows_scale, cap, pool)
        plan = plan_json(job, env, 0)
        # The store as the plan saw it, for planning again with other code (kept runs only).
        planned(work / "out" / "state.db", work / "planned.db")
        pilot_runs = len(run_lines(work / "out" / "run.log"))
        codes, kills = run_until_end(job, env, args.kill_at, watch)
        late.append(simproc.late(base_url) if sims[0][0].poll() is None else {})
    finally:
        for sim, _ in sims:
            if sim.poll() is None:
                sim.terminate()
            sim.wait()
    db = sqlite3.connect(work / "out" / "state.db")
    spans = db.execute(
        "SELECT started_at, ended_at FROM runs WHERE kind = 'run' ORDER BY started_at"
    ).fetchall()
    # What the runs spent after the pilot (the plan's figures are for what was left then).
    (pilot_end,) = db.execute("SELECT MAX(ended_at) FROM runs WHERE kind = 'pilot'").fetchone()
    (cost,) = db.execute(
        "SELECT SUM(COALESCE(cost_usd, 0)) FROM ledger WHERE created_at > ?", (pilot_end or 0,)
    ).fetchone()
    unsent = dict(db.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
    db.close()
    runs = run_lines(work / "out" / "run.log")[pilot_runs:]
    end = max(e or s for s, e in spans) if spans else time.time()
    # Seconds between a kill and the next run's first line: no ETA can know them. A point in
    # run j has the gaps after runs j, j+1, ... taken from its time left.
    starts = [r[0][0] if r else end for r in runs]
    gaps = [max(0.0, starts[i + 1] - k) for i, k in enumerate(kills) if i + 1 < len(starts)]

    def point(run: int, reached: Callable[[float, dict[str, str]], bool]) -> dict[str, Any] | None:
        p = eta_point(runs[run], end, reached)
        if p is not None:
            p["left"] -= sum(gaps[run:])
        return p

    every = [(t, f, i) for i, r in enumerate(runs) for t, f in r]
    checks: dict[str, Any] = {}
    for at in (0.1, 0.5):
        hit = next(((t, i) for t, f, i in every if done_share(f) >= at), None)
        if hit is not None:
            checks[f"at {at:.0%}"] = point(hit[1], lambda t, f, h=hit[0]: t >= h)
    if died:
        hit = next(((t, i) for t, f, i in every if t >= died[0]), None)
        if hit is not None:
            checks["server died"] = point(hit[1], lambda t, f, h=hit[0]: t >= h)
    for i in range(1, len(runs)):
        first = runs[i][0][1] if runs[i] else {}
        p = point(i, lambda t, f: True)
        # Whether the very first line was a hold rather than a figure.
        checks[f"restart {i}"] = p and {**p, "first_line_held": "held_until" in first}
    wall = end - (starts[0] if starts else end) - sum(gaps)
    return {
        "seed": seed,
        "cap": cap,
        "plan_cost": interval(plan["job"]["cost_usd"]),
        "plan_wall": interval(plan["job"]["time_s"]),
        "plan_job": {k: v for k, v in plan["job"].items() if k not in ("cost_usd", "time_s")},
        "cost": cost,
        "wall": wall,
        "exit_codes": codes,
        "items": unsent,
        "cap_unsent": cap_unsent(work / "out" / "run.log"),
        "checks": checks,
        "sim_late": {"pilot": late[0], "run": simproc.late_since(late[0], late[1])},
    }


def planned(db: Path, to: Path) -> None:
    """A consistent copy of the job's store (SQLite's backup: the WAL's pages included)."""
    src, dst = sqlite3.connect(db), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def plan_json(job: Path, env: dict[str, str], pilot: int) -> dict[str, Any]:
    """`regen plan --json`, after a pilot of `pilot` items per dataset (0: what is known)."""
    out = subprocess.run(
        [*regen_cmd(), "plan", str(job), "--pilot", str(pilot), "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def report(results: list[dict[str, Any]]) -> None:
    print(
        "| seed | plan $ (p10-p90) | cap $ | actual $ | plan wall s | actual wall s | exits "
        "| items |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        c, c10, c90 = r["plan_cost"]
        print(
            f"| {r['seed']} | {c:.3f} ({c10:.3f}-{c90:.3f}) | {r['cap']:.3f} | {r['cost']:.3f} | "
            f"{r['plan_wall'][0]:.0f} | {r['wall']:.0f} | {r['exit_codes']} | {r['items']} |"
        )
    print()
    print("| seed | simulator's answers late by over 50 ms (mean, worst): pilot | run |")
    print("|---|---|---|")
    for r in results:
        late = r.get("sim_late", {})
        print(
            f"| {r['seed']} | {simproc.late_cell(late.get('pilot', {}))} | "
            f"{simproc.late_cell(late.get('run', {}))} |"
        )
    print()
    print(
        "| seed | how the plan said the job ends | how it ended | items the cap left: plan / "
        "actual / error |"
    )
    print("|---|---|---|---|")
    counts = []
    for r in results:
        ended = "cap (exit 4)" if r["exit_codes"][-1] == 4 else f"exit {r['exit_codes'][-1]}"
        unsent = r["items"].get("pending", 0)
        planned, left = r["plan_job"].get("unsent") or 0, sum(r.get("cap_unsent", {}).values())
        err = planned / left - 1 if left else (0.0 if not planned else math.inf)
        counts.append(err)
        print(
            f"| {r['seed']} | {r['plan_job'].get('stop', '-')} | {ended}, {unsent} pending "
            f"| {planned} / {left} / {err:+.0%} |"
        )
    if counts:
        print(
            f"\nthe items the cap left within 20% of the plan's count on "
            f"{sum(abs(e) <= 0.2 for e in counts)} of {len(counts)}"
        )
    print()
    print("| seed | point | ETA s (p10-p90) | basis | actual left s | error | in interval |")
    print("|---|---|---|---|---|---|---|")
    errs = []
    for r in results:
        for point, e in r["checks"].items():
            if e is None:
                print(f"| {r['seed']} | {point} | - | - | - | - | - |")
                continue
            err = e["eta"] / max(e["left"], 1e-9) - 1
            errs.append((err, e["p10"] <= e["left"] <= e["p90"]))
            basis = "prior" if e["prior"] else "measured"
            lanes = " ".join(f"{k}={v}" for k, v in e.get("lanes", {}).items())
            print(
                f"| {r['seed']} | {point} | {e['eta']:.0f} ({e['p10']:.0f}-{e['p90']:.0f}) | "
                f"{basis} | {e['left']:.0f} | {err:+.0%} | {'yes' if errs[-1][1] else 'no'} |"
                + (f" {lanes} |" if lanes else "")
            )
    if errs:
        within = sum(abs(e) <= 0.2 for e, _ in errs) / len(errs)
        worst = max(max(1 + e, 1 / max(1 + e, 1e-9)) for e, _ in errs)
        cover = sum(c for _, c in errs) / len(errs)
        print(
            f"\n{len(errs)} checks: within 20% {within:.0%} (target 90%), worst factor "
            f"{worst:.2f}x (target 2x), interval held {cover:.0%} (target 70-90%)"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-scale", type=float, default=1.0, help="multiplies each dataset's rows")
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--kill-at", type=float, default=0.3, help="share of items done at the kill")
    ap.add_argument("--cap-share", type=float, default=0.85, help="the cap over the plan's cost")
    ap.add_argument(
        "--pilot",
        type=int,
        default=30,
        help="items per dataset in the pilot (30, README's; 20 before 7 December 2026, 21:00 UTC)",
    )
    ap.add_argument("--pool", type=int, default=0, help="self-hosted servers (0: OpenRouter)")
    ap.add_argument("--seqs", type=int, default=30, help="each pool server's max_num_seqs")
    ap.add_argument("--die-at", type=float, default=0.5, help="share done when a server dies")
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--summarize", type=Path, help="print the tables of a --json file")
    ap.add_argument("--lock", type=Path)
    args = ap.parse_args()
    if args.summarize:
        report(json.loads(args.summarize.read_text()))
        return
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    print(simproc.machine_line(), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as d:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with held(args.lock):
                results.append(one(seed, args, args.keep or Path(d)))
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
