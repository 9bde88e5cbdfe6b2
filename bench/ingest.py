"""How long a big dataset takes before its first request, and again on a rerun.

For each size (10k, 100k and 1M rows) and each source kind (one JSONL file; a folder of
Parquet files of at most 100k rows each), with synthetic chat rows (a third with a system
prompt, one to three user/assistant turns, about 750 bytes a row):

- ingest: CPU seconds of `ingest()` into a new state.db (in its own process), ms per row, the
  process's peak RSS;
- rerun: `regen run` again with the sources unchanged, against `regen sim` (its own process,
  core 0): wall seconds from starting the process to the first request the simulator
  receives (then the run is killed, as a user's Ctrl-C would end it);
- status and export: every item answered (short answers), then `regen status` and
  `regen export` (specforge) as their own processes: wall and CPU seconds.

Issue 23's targets: 1M rows ingested in at most 30 s CPU, linear from 10k; a rerun with
unchanged sources reaches its first request in at most 2 s; status and export linear.

Run: flock /tmp/bench.lock .venv/bin/python bench/ingest.py [--rows 10000,100000,1000000]
     [--kinds jsonl,parquet] [--data DIR] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import simproc

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "model",
    "token",
    "data",
    "python",
    "function",
    "returns",
    "list",
    "value",
    "error",
    "file",
    "code",
    "test",
    "write",
    "explain",
    "why",
    "how",
]

SIM_TOML = """
seed = 1

[[models]]
id = "bench/model"
mean_completion_tokens = 20

[[models.endpoints]]
provider_name = "Bench"
tag = "bench"
ttft_s = 0.05
tokens_per_s = 1000
prompt_price = 0.0000006
completion_price = 0.0000025
"""

JOB_TOML = """
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
api_key_env = "BENCH_KEY"

[generation]
model = "bench/model"
max_tokens = 100

[run]
concurrency = 8

[[datasets]]
name = "d"
path = "{path}"
"""

PARQUET_FILE_ROWS = 100_000


def synthetic_row(i: int, rng: random.Random) -> dict[str, object]:
    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))

    msgs = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": "You are a helpful assistant. " + text(3, 12)})
    for t in range(rng.choice((1, 1, 1, 2, 3))):
        msgs.append({"role": "user", "content": f"{i}.{t}: " + text(8, 60)})
        msgs.append({"role": "assistant", "content": text(10, 90)})
    return {"messages": msgs, "id": i}


def make_data(data: Path, n: int, kind: str) -> Path:
    """The source (made once per size and kind, then reused)."""
    path = data / (f"rows-{n}.jsonl" if kind == "jsonl" else f"rows-{n}-parquet")
    if path.exists():
        return path
    rng = random.Random(n)
    if kind == "jsonl":
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            for i in range(n):
                f.write(json.dumps(synthetic_row(i, rng)) + "\n")
        tmp.rename(path)
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp_dir = path.with_name(path.name + ".tmp")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    for part, start in enumerate(range(0, n, PARQUET_FILE_ROWS)):
        rows = [synthetic_row(i, rng) for i in range(start, min(n, start + PARQUET_FILE_ROWS))]
        pq.write_table(pa.Table.from_pylist(rows), tmp_dir / f"part-{part:05d}.parquet")
    tmp_dir.rename(path)
    return path


def child_ingest(job_path: str) -> None:
    """In its own process: ingest the job into a new state.db; print CPU, wall, items, RSS."""
    from regen.config import load_job
    from regen.sources.ingest import ingest
    from regen.state.db import Store

    job = load_job(Path(job_path))
    store = Store.open(job.output_path)
    cpu0, wall0 = time.process_time(), time.monotonic()
    ingest(store, job)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    progress = store.work.dataset_progress()
    store.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    items = sum(p.items for p in progress)
    print(json.dumps({"cpu": cpu, "wall": wall, "items": items, "rss_mb": rss}))


def child_answer(out: str) -> None:
    """In its own process: record a short answer for every pending item, as a run would: in
    dispatch order (which is random in the source's order)."""
    from regen.conversation import Attempt, Message, Outcome, Result, Usage
    from regen.state.db import Store

    store = Store.open(Path(out))
    items = list(
        store._db.execute(
            "SELECT id, dataset FROM items WHERE status = 'pending' ORDER BY dataset, order_key"
        )
    )
    batch: list[Outcome] = []
    now = time.time()
    for k, (item, ds) in enumerate(items):
        r = Result(
            item,
            Message("assistant", f"answer {k}: the model returns a list of values"),
            "stop",
            Usage(60, 12, 0, 0.00005),
            provider="Bench",
        )
        batch.append(Outcome(item, ds, (Attempt(1, now, 0.5, 200),), result=r))
        if len(batch) == 5000 or k == len(items) - 1:
            store.commit_outcomes(batch)
            batch = []
    store.close()


def child_cpu(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of a command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sim_requests(base_url: str) -> int:
    root = base_url.removesuffix("/api/v1")
    with urllib.request.urlopen(f"{root}/_sim/stats", timeout=5) as r:
        return int(json.loads(r.read())["chat_requests"])


def first_request_s(job: Path, base_url: str, env: dict[str, str]) -> float:
    """Seconds from starting `regen run` to the simulator's first chat request of this run;
    the run is then killed (a kill leaves state.db consistent: each result is a
    transaction)."""
    seen = sim_requests(base_url)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen", "run", str(job)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        while sim_requests(base_url) == seen:
            if proc.poll() is not None:
                raise SystemExit(f"regen run ended before sending: {proc.stderr.read()[-2000:]}")
            time.sleep(0.005)
        return time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()


def one(n: int, kind: str, data: Path, tmp: Path, base_url: str, rounds: int) -> dict[str, float]:
    source = make_data(data, n, kind)
    work = tmp / f"{kind}-{n}"
    work.mkdir()
    job = work / "job.toml"
    job.write_text(JOB_TOML.format(base_url=base_url, path=source))
    env = {**os.environ, "BENCH_KEY": "sk-bench"}
    out = subprocess.run(
        [sys.executable, __file__, "--child-ingest", str(job)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    ing = json.loads(out.stdout.strip().splitlines()[-1])
    reruns = [first_request_s(job, base_url, env) for _ in range(rounds)]
    subprocess.run([sys.executable, __file__, "--child-answer", str(work / "out")], check=True)
    status_wall, status_cpu = child_cpu(
        [sys.executable, "-m", "regen", "status", str(work / "out")], env
    )
    export_wall, export_cpu = child_cpu(
        [sys.executable, "-m", "regen", "export", str(work / "out"), "--to", str(work / "x")], env
    )
    return {
        "bytes": sum(
            f.stat().st_size for f in ([source] if source.is_file() else source.iterdir())
        ),
        "items": ing["items"],
        "ingest_cpu": ing["cpu"],
        "ingest_wall": ing["wall"],
        "rss_mb": ing["rss_mb"],
        "rerun_first": min(reruns),
        "status_wall": status_wall,
        "status_cpu": status_cpu,
        "export_wall": export_wall,
        "export_cpu": export_cpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="10000,100000,1000000")
    ap.add_argument("--kinds", default="jsonl,parquet")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "regen-bench-ingest")
    ap.add_argument("--rounds", type=int, default=2, help="reruns timed (the best is shown)")
    ap.add_argument("--child-ingest", help=argparse.SUPPRESS)
    ap.add_argument("--child-answer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_ingest:
        return child_ingest(args.child_ingest)
    if args.child_answer:
        return child_answer(args.child_answer)
    print(simproc.machine_line())
    args.data.mkdir(parents=True, exist_ok=True)
    print(
        "| source | rows | MB | items | ingest CPU s | ms/row | ingest wall s | peak RSS MB "
        "| rerun to 1st request s | status s (CPU) | export s (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sim, base_url = simproc.start_sim(SIM_TOML, tmp)
        try:
            for kind in args.kinds.split(","):
                for n in (int(x) for x in args.rows.split(",")):
                    r = one(n, kind, args.data, tmp, base_url, args.rounds)
                    print(
                        f"| {kind} | {n:,} | {r['bytes'] / 1e6:.0f} | {r['items']:,} "
                        f"| {r['ingest_cpu']:.1f} | {1000 * r['ingest_cpu'] / n:.3f} "
                        f"| {r['ingest_wall']:.1f} | {r['rss_mb']:.0f} | {r['rerun_first']:.2f} "
                        f"| {r['status_wall']:.2f} ({r['status_cpu']:.2f}) "
                        f"| {r['export_wall']:.2f} ({r['export_cpu']:.2f}) |",
                        flush=True,
                    )
        finally:
            sim.terminate()
            sim.wait()


if __name__ == "__main__":
    main()
