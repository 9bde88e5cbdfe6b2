"""Torture runs: kill `regen run` with SIGKILL again and again, rerun it at once, and then check
that nothing was lost, nothing was paid or written twice, every cap and budget held, and
whatever is left unsent is listed with its reason.

The simulator (in this process, so that it outlives every kill) bills an answer when its
generation ends, whether or not the client is still there (as OpenRouter does), so the
requests in flight at each kill are billed after the client is gone. Scenarios:

- `mixed` (issue 20): a non-streamed short lane escalating to a streamed long lane, an
  each-turn dataset, a sequential one, a token budget and a job dollar cap, faults on (429s
  above a capacity, 5xx, stalls, cut connections, mid-stream errors, HTTP 200 error bodies);
  kills at start-up, at a dataset boundary, in dispatch and in the export.
- `dataset-cap`: a $1.50 cap on the first dataset, no job cap (it once ended at $3.74).
- `token-budget`: a 200,000-token budget on the first dataset (it once paid for 585k).
- `nested-cap`: the $1.50 dataset cap under a $50 job cap.
- `neighbour`: a $6 job cap while another job spends on the same key all along (a $4 cap
  once stopped the job at "$9.56 spent" with $2.39 of its own).
- `samples` (issue 35): `samples = 4` with a temperature mix and a seed on three datasets (no
  sequential one), under a $12 job cap: every prompt ends with its 4 samples done, each with
  its own seed and the settings it was sent recorded.
- `managed`: a $5 job cap with a management key: each run makes a key of its own whose
  credit limit the simulator enforces as OpenRouter documents.
- `managed-stale`: the same, but the job file's prices are a fifth of what the provider
  bills (a price list gone stale): each run's first requests are admitted at a fifth of
  their worst cases, until a bill raises the prices.

Each kill lands at a named moment (start-up, or dispatch after a seeded number of answers);
the runs after the kills go on until the job ends. For each rerun after a kill, the bench
measures how long after the last bill of the killed run's requests the rerun sends again
(when it had to wait for them).

    .venv/bin/python bench/torture.py [--scenario NAME|all] [--kills 20] [--seed 1] [--json]

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
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from regen.sim.server import LoggedRequest

KEY = "sk-torture-not-a-secret"
MANAGEMENT_KEY = "sk-torture-management-not-a-secret"
STALE_PROMPT, STALE_COMPLETION = 0.12, 0.5
"""USD per million tokens: a fifth of the simulator's highest for the model (0.6, 2.5)."""
NEIGHBOUR_PREFIX = "nb"
MOMENTS = ("start-up", "dispatch", "dataset boundary", "export")


def rows(tmp: Path, n: int, prefix: str = "") -> None:
    """Three sources: single questions, two-turn chats (each turn), and three-turn chats
    (sequential)."""

    def chat(i: int, turns: int, tag: str) -> dict[str, Any]:
        msgs = []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"{tag} {i} turn {t}: explain step {t}."})
            msgs.append({"role": "assistant", "content": f"old answer {t}"})
        return {"messages": msgs}

    for name, turns, count in (("single", 1, n), ("each", 2, n // 3), ("seq", 3, n // 4)):
        with (tmp / f"{prefix}{name}.jsonl").open("w") as f:
            for i in range(count):
                f.write(json.dumps(chat(i, turns, prefix + name)) + "\n")


def job_text(
    tmp: Path,
    base_url: str,
    *,
    out: str = "out",
    prefix: str = "",
    job_cap: float | None = None,
    single: str = "",
    endpoint: str = 'api_key_env = "TORTURE_KEY"',
    lanes: str | None = None,
    run: str = "",
    generation: str = "",
    third_mode: str = "sequential",
    datasets: str = "",
) -> str:
    """The job file: three datasets (`datasets`: lines added to each), two lanes by default."""
    lanes = (
        lanes
        if lanes is not None
        else (
            '[[lanes]]\nname = "short"\nconcurrency = 64\nmax_tokens = 256\n'
            'escalate_to = "long"\n\n'
            '[[lanes]]\nname = "long"\nconcurrency = 48\nmax_tokens = 1024\nstream = true\n'
        )
    )
    budget = "" if job_cap is None else f"[budget]\nmax_cost_usd = {job_cap}\n"
    return f"""
[job]
name = "torture"
output_dir = "{tmp / out}"

[endpoint]
base_url = "{base_url}"
{endpoint}

[generation]
model = "moonshotai/kimi-k2.5"
max_tokens = 1024
{generation}

[run]
initial_limit = 64
idle_timeout_s = 1.0
timeout_s = 8
max_attempts = 6
stop_grace_s = 5
progress_interval_s = 1
{run}

{budget}
{lanes}

[[datasets]]
name = "single"
path = "{tmp / (prefix + "single.jsonl")}"
{single}
{datasets}

[[datasets]]
name = "each"
path = "{tmp / (prefix + "each.jsonl")}"
mode = "each_turn"
{datasets}

[[datasets]]
name = "seq"
path = "{tmp / (prefix + "seq.jsonl")}"
mode = "{third_mode}"
{datasets}
"""


def faulty(seed: int) -> SimConfig:
    """Faults on, and one provider endpoint with a capacity below the lanes' concurrency."""
    faults = SimFaults(
        http_5xx=0.03,
        http_5xx_codes=[500, 502, 503],
        stall=0.01,
        stall_s=3.0,
        reset=0.01,
        midstream_error=0.01,
        error_200=0.01,
    )
    base = SimConfig(seed=seed, time_scale=0.05, faults=faults, log_bodies=True)
    model = base.models[0]
    endpoint = model.endpoints[0].model_copy(update={"capacity": 80})
    models = [model.model_copy(update={"endpoints": [endpoint]}), *base.models[1:]]
    return base.model_copy(update={"models": models})


def calm(seed: int, **kw: Any) -> SimConfig:
    """No faults: what is checked is money across kills."""
    return SimConfig(seed=seed, time_scale=0.05, log_bodies=True, **kw)


@dataclass
class Scenario:
    name: str
    sim: Callable[[int], SimConfig]
    job: Callable[[Path, str], str]
    moments: tuple[float, float]
    """Weights of the kill moments start-up and dispatch (the boundary and the export are
    added to the mixed scenario only)."""
    caps: dict[str, float] = field(default_factory=dict)
    """Dollar caps to check: a dataset's name, or `job`."""
    token_budget: tuple[str, int] | None = None
    neighbour: bool = False
    managed: bool = False
    samples: int = 1
    """Answers per prompt the job asks for (checked: exactly that many, distinct seeds)."""
    rows_div: int = 1
    """The scenario reads rows / rows_div rows (a samples job sends that many times more)."""


def managed(name: str, prices: str = "") -> Scenario:
    """A $5 job cap on keys made per run with a management key (`prices`: the job file's)."""
    endpoint = f'management_key_env = "TORTURE_MANAGEMENT_KEY"\n{prices}'
    return Scenario(
        name,
        lambda seed: calm(seed, management_keys=[MANAGEMENT_KEY]),
        lambda tmp, url: job_text(tmp, url, job_cap=5.0, endpoint=endpoint),
        (1, 6),
        {"job": 5.0},
        managed=True,
    )


SHARED_SYSTEM = " ".join(f"Rule {i}: answer step by step and cite the step." for i in range(30))
"""A long system prompt every request starts with: most of each prompt is a prefix the
provider's cache has seen (the caching scenario)."""


def cached_job(tmp: Path, url: str) -> str:
    """A $12 job cap where every prompt opens with the same long system prompt, sent only to
    Moonshot, whose cache reads cost a quarter (priced from the endpoint's listing, a session
    id per conversation)."""
    system = f'system = "replace"\nsystem_prompt = "{SHARED_SYSTEM}"'
    endpoint = 'api_key_env = "TORTURE_KEY"\nprovider = {only = ["moonshotai"]}'
    return job_text(tmp, url, job_cap=12.0, datasets=system, endpoint=endpoint)


SCENARIOS = {
    "mixed": Scenario(
        "mixed",
        faulty,
        lambda tmp, url: job_text(tmp, url, job_cap=6.0, single="token_budget = 60_000"),
        (1, 3),
        {"job": 6.0},
    ),
    "dataset-cap": Scenario(
        "dataset-cap",
        calm,
        lambda tmp, url: job_text(tmp, url, single="max_cost_usd = 1.5"),
        (1, 6),
        {"single": 1.5},
    ),
    "token-budget": Scenario(
        "token-budget",
        calm,
        lambda tmp, url: job_text(tmp, url, single="token_budget = 200_000"),
        (1, 6),
        token_budget=("single", 200_000),
    ),
    "nested-cap": Scenario(
        "nested-cap",
        calm,
        lambda tmp, url: job_text(tmp, url, job_cap=50.0, single="max_cost_usd = 1.5"),
        (1, 6),
        {"single": 1.5, "job": 50.0},
    ),
    "neighbour": Scenario(
        "neighbour",
        calm,
        lambda tmp, url: job_text(tmp, url, job_cap=6.0),
        (1, 6),
        {"job": 6.0},
        neighbour=True,
    ),
    "samples": Scenario(
        "samples",
        calm,
        lambda tmp, url: job_text(
            tmp,
            url,
            job_cap=12.0,
            generation="samples = 4\ntemperature = [0.2, 0.7, 1.0]\nseed = 5",
            third_mode="each_turn",
        ),
        (1, 6),
        {"job": 12.0},
        samples=4,
        rows_div=4,
    ),
    "caching": Scenario(
        "caching",
        lambda seed: calm(seed, prompt_caching=True),
        cached_job,
        (1, 6),
        {"job": 12.0},
    ),
    "managed": managed("managed"),
    "managed-stale": managed(
        "managed-stale",
        f"prompt_usd_per_mtok = {STALE_PROMPT}\ncompletion_usd_per_mtok = {STALE_COMPLETION}",
    ),
}


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
) -> tuple[int, str, float]:
    """Run `regen run`; kill it with SIGKILL at `moment` (None: let it finish). Returns its
    exit code (-9 when killed), its output and when it started."""
    log = job.parent / f"run-{time.monotonic_ns()}.log"
    started_at = time.time()
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
    return code, log.read_text(), started_at


def dataset_of(entry: LoggedRequest) -> str | None:
    """Which source a request's prompt came from (its last user turn starts with the tag)."""
    if entry.body is None:
        return None
    text = str(entry.body["messages"][-1].get("content", ""))
    return text.split(" ", 1)[0]


def release_gaps(
    chat: list[LoggedRequest], runs: list[tuple[float, int]]
) -> tuple[list[float], int]:
    """For each run after a killed one: seconds from the last bill of the killed run's
    requests to the rerun's next request after it, when the rerun waited for those bills
    (sent nothing between them), and how many reruns did not have to wait."""
    gaps: list[float] = []
    free = 0
    for i in range(len(runs) - 1):
        start, code = runs[i]
        if code != -signal.SIGKILL:
            continue
        nxt = runs[i + 1][0]
        after = runs[i + 2][0] if i + 2 < len(runs) else float("inf")
        bills = [
            e.billed_at
            for e in chat
            if start <= e.at < nxt and e.billed and e.billed_at is not None
        ]
        if not bills:
            continue
        last = max(bills)
        sent = sorted(e.at for e in chat if nxt <= e.at < after)
        waited = [t for t in sent if t >= last]
        if sent and sent[0] < last and len(waited) < len(sent):
            free += 1  # it sent between the kill and the last bill: not held back
            if not waited:
                continue
        if waited and last > nxt:
            gaps.append(waited[0] - last)
    return gaps, free


def torture(s: Scenario, kills: int, seed: int, n_rows: int) -> dict[str, Any]:
    rng = random.Random(seed)
    env = {
        **os.environ,
        "TORTURE_KEY": KEY,
        "TORTURE_MANAGEMENT_KEY": MANAGEMENT_KEY,
    }
    report: dict[str, Any] = {"scenario": s.name, "kills": [], "reruns": []}
    with tempfile.TemporaryDirectory() as tmp_name, sim_in_thread(s.sim(seed)) as sim:
        tmp = Path(tmp_name)
        rows(tmp, n_rows // s.rows_div)
        job = tmp / "job.toml"
        job.write_text(s.job(tmp, sim.base_url))
        neighbour = None
        if s.neighbour:
            # Another job on the same key, spending all along; it is never killed.
            rows(tmp, n_rows * 2, prefix=NEIGHBOUR_PREFIX)
            nb_job = tmp / "neighbour.toml"
            nb_job.write_text(
                job_text(tmp, sim.base_url, out="nb-out", prefix=NEIGHBOUR_PREFIX, lanes="")
                .replace('name = "torture"', 'name = "neighbour"')
                .replace("[run]", "[run]\nconcurrency = 24", 1)
            )
            neighbour = subprocess.Popen(
                [sys.executable, "-m", "regen", "run", str(nb_job)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        watch = Watch(tmp / "out")
        highest = 0.0
        moments: Counter[str] = Counter()
        runs: list[tuple[float, int]] = []
        if s.name == "mixed":
            plan = ["start-up", "dataset boundary"]
            plan += rng.choices(MOMENTS[:2], weights=s.moments, k=max(0, kills - 3))
            plan += ["export"]
        else:
            plan = rng.choices(MOMENTS[:2], weights=s.moments, k=kills)
        texts: list[str] = []
        left_out: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
        for moment in plan:
            if moment == "dataset boundary" and watch.second_dataset_started():
                moment = "dispatch"  # the boundary is behind: kill in dispatch instead
            code, text, at = run_once(job, env, watch, moment, rng)
            runs.append((at, code))
            texts.append(text)
            billed = sim.simulator.billed_usd()
            highest = max(highest, billed)
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            report["kills"].append(
                {
                    "moment": moment,
                    "exit": code,
                    "billed_usd": billed,
                    "ledger_usd": watch.ledger(),
                    "error": errors[-1] if errors else None,
                }
            )
            if code == -signal.SIGKILL:
                moments[moment] += 1
                # What the kill left outstanding, and how much of it the next run can look
                # up by generation id (per lane: the short one is not streamed).
                for lane, n, named in watch.query(
                    "SELECT lane, COUNT(*), COUNT(generation_id) FROM outstanding "
                    "WHERE run_id = (SELECT MAX(id) FROM runs) GROUP BY lane"
                ):
                    left_out[lane or "-"][0] += n
                    left_out[lane or "-"][1] += named
            elif code in (0, 3, 4):
                break  # the job ended before the kill: the job is smaller than the kills
        # Rerun the same command until it ends with nothing left to send (0, 3) or at a cap.
        for _ in range(10):
            code, text, at = run_once(job, env, watch, None, rng)
            runs.append((at, code))
            texts.append(text)
            report["reruns"].append(code)
            if code != 5:
                break
        if neighbour is not None:
            neighbour.wait(timeout=600)
        sim.simulator.wait_billed(120)  # the last generations end and are billed
        chat = sim.simulator.chat_log()
        ours = [e for e in chat if not (dataset_of(e) or "").startswith(NEIGHBOUR_PREFIX)]
        billed_by: dict[str, float] = Counter()
        tokens_by: dict[str, int] = Counter()
        for e in ours:
            if e.billed:
                ds = dataset_of(e) or "?"
                billed_by[ds] += e.cost_usd
                tokens_by[ds] += e.completion_tokens
        billed_ours = sum(billed_by.values())
        prompt_tokens = sum(e.prompt_tokens for e in ours if e.billed)
        report["cached_share"] = round(
            sum(e.cached_tokens for e in ours if e.billed) / max(1, prompt_tokens), 4
        )
        highest = max(highest, sim.simulator.billed_usd())
        status = dict(watch.query("SELECT status, COUNT(*) FROM items GROUP BY status"))
        total = sum(status.values())
        ledger = watch.ledger()
        dup_results = watch.query("SELECT COUNT(*) - COUNT(DISTINCT item_id) FROM results")[0][0]
        done_results = watch.query("SELECT COUNT(*) FROM results")[0][0]
        kinds = dict(watch.query("SELECT kind, ROUND(SUM(cost_usd), 6) FROM ledger GROUP BY 1"))
        export_ids: list[str] = []
        for f in sorted((tmp / "out" / "export").glob("*.jsonl")):
            export_ids += [json.loads(line)["id"] for line in f.read_text().splitlines()]
        last = texts[-1]
        # Answers the run's export leaves out by design (their history holds the dataset's
        # own assistant turns), as its summary says.
        left_by_design = sum(
            int(m[1]) for m in re.finditer(r"export: (\d+) answer\(s\) of \S+ left out", last)
        )
        unsent = [
            (m[1], int(m[2]), m[3])
            for m in re.finditer(r"dataset (\S+): (\d+) items not sent: (.+)", last)
        ]
        bounds = [int(b) for t in texts for b in re.findall(r"bound: (\d+), the max_tokens", t)]
        gaps, free = release_gaps(ours, runs)
        left = status.get("pending", 0)
        listed = sum(n for _, n, _ in unsent)
        report.update(
            kills_at=dict(moments),
            items=total,
            by_status=status,
            lost=total - status.get("done", 0) - status.get("failed", 0) - listed,
            results_duplicated=dup_results,
            export_rows=len(export_ids),
            export_rows_duplicated=len(export_ids) - len(set(export_ids)),
            export_rows_missing=done_results - len(set(export_ids)) - left_by_design,
            export_rows_left_out_by_design=left_by_design,
            ledger_usd=round(ledger, 6),
            ledger_by_kind=kinds,
            billed_usd=round(billed_ours, 6),
            billed_by_dataset={k: round(v, 6) for k, v in billed_by.items()},
            completion_tokens_by_dataset=dict(tokens_by),
            billed_not_in_ledger_usd=round(billed_ours - ledger, 6),
            neighbour_billed_usd=round(sim.simulator.billed_usd() - billed_ours, 6),
            pending=left,
            unsent_listed=unsent,
            final_exit=report["reruns"][-1] if report["reruns"] else None,
            final_stop=next((ln for ln in last.splitlines() if ln.startswith("stopped:")), None),
            requests=len(ours),
            statuses=dict(Counter(e.status for e in ours)),
            release_gaps_s=[round(g, 2) for g in gaps],
            reruns_not_held=free,
            overshoot_bounds=bounds,
            left_at_kills_named={lane: f"{named}/{n}" for lane, (n, named) in left_out.items()},
        )
        if s.samples > 1:
            report.update(samples_check(watch, s.samples))
        if s.managed:
            made = sim.simulator.keys.listed(include_disabled=True)
            usage = {k.hash: sim.simulator.account.usage_of(k.secret) for k in made}
            report["keys"] = [
                {
                    "limit": None if k.limit is None else round(k.limit, 6),
                    "usage": round(usage[k.hash], 6),
                    "disabled": k.disabled,
                }
                for k in made
            ]
            report["keys_made"] = sim.simulator.keys.created
            report["keys_usage_usd"] = round(sum(usage.values()), 6)
            report["keys_over_their_limit"] = sum(
                1 for k in made if k.limit is not None and usage[k.hash] > k.limit + 1e-9
            )
            report["refused_402"] = sum(1 for e in ours if e.status == 402)
            report["repriced"] = [ln for ln in last.splitlines() if "were billed up to" in ln]
    failures = []
    if sum(moments.values()) < min(kills, 20):
        failures.append(f"only {sum(moments.values())} kills landed")
    if report["lost"] != 0:
        failures.append(f"{report['lost']} items neither done, failed nor listed as unsent")
    if report["results_duplicated"] or report["export_rows_duplicated"]:
        failures.append("an answer or an export row is there twice")
    if report["export_rows_missing"]:
        failures.append(f"{report['export_rows_missing']} answers are missing from the export")
    for scope, cap in s.caps.items():
        spent = billed_ours if scope == "job" else billed_by.get(scope, 0.0)
        if spent > cap + 1e-9:
            failures.append(f"{scope}: billed ${spent:.4f} over its ${cap} cap")
    if s.token_budget is not None:
        ds, budget = s.token_budget
        used = tokens_by.get(ds, 0)
        bound = max(bounds, default=64 * 256 + 48 * 1024)
        report["token_overshoot"] = used - budget
        if used > budget + bound:
            failures.append(f"{ds}: {used} tokens paid for a {budget} budget (bound {bound})")
    if left != listed:
        failures.append(f"{left} items pending but {listed} listed as not sent")
    if s.neighbour:
        stop = report["final_stop"] or ""
        if report["final_exit"] == 4 and billed_ours < 0.9 * s.caps["job"]:
            failures.append(f"stopped at ${billed_ours:.2f} of its own: {stop}")
        if report["neighbour_billed_usd"] <= 0:
            failures.append("the neighbour spent nothing: the scenario proves nothing")
    if s.name == "caching" and not report["cached_share"]:
        failures.append("no prompt token was read from a cache: the scenario proves nothing")
    if s.managed and abs(report.get("keys_usage_usd", 0.0) - billed_ours) > 1e-6:
        failures.append(
            f"the job's keys used ${report.get('keys_usage_usd')}, the job was billed "
            f"${billed_ours:.6f}"
        )
    if s.samples > 1:
        if report["prompts_without_all_samples"]:
            failures.append(f"{report['prompts_without_all_samples']} prompts lack a sample")
        if report["prompts_with_a_repeated_seed"] or report["answers_without_settings"]:
            failures.append("a prompt's samples share a seed, or an answer has no settings")
    report["failures"] = failures
    return report


def samples_check(watch: Watch, k: int) -> dict[str, Any]:
    """Per prompt (conversation and turn): how many of its K samples are in state.db, done,
    and the seeds and temperatures their requests carried."""
    per: defaultdict[tuple[str, int], list[tuple[int, str, str | None]]] = defaultdict(list)
    for cid, turn, sample, status, settings in watch.query(
        "SELECT i.conversation_id, i.turn_index, i.sample, i.status, r.settings FROM items i "
        "LEFT JOIN results r ON r.item_id = i.id"
    ):
        per[(cid, turn)].append((sample, status, settings))
    incomplete = repeated = unsettled = 0
    temperatures: Counter[float] = Counter()
    for entries in per.values():
        if sorted(e[0] for e in entries) != list(range(k)) or any(e[1] != "done" for e in entries):
            incomplete += 1
        sent = [json.loads(e[2]) for e in entries if e[2] is not None]
        unsettled += sum(1 for e in entries if e[1] == "done" and e[2] is None)
        seeds = [x.get("seed") for x in sent]
        if len(set(seeds)) != len(seeds) or None in seeds:
            repeated += 1
        temperatures.update(x.get("temperature") for x in sent)
    return {
        "prompts": len(per),
        "prompts_without_all_samples": incomplete,
        "prompts_with_a_repeated_seed": repeated,
        "answers_without_settings": unsettled,
        "temperatures_sent": dict(temperatures),
    }


def show(report: dict[str, Any]) -> None:
    print(f"== {report['scenario']}")
    for k in report["kills"]:
        print(
            f"kill at {k['moment']:<16} exit {k['exit']:>3}  billed ${k['billed_usd']:.4f}"
            f"  ledger ${k['ledger_usd']:.4f}" + (f"  {k['error']}" if k["error"] else "")
        )
    skip = {"kills", "failures", "scenario"}
    for key, value in report.items():
        if key not in skip:
            print(f"{key}: {value}")
    failures = report["failures"]
    print("checks: " + ("all passed" if not failures else "; ".join(failures)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="all", choices=["all", *SCENARIOS])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=2400)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    reports = [torture(SCENARIOS[n], args.kills, args.seed, args.rows) for n in names]
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        for r in reports:
            show(r)
    return 1 if any(r["failures"] for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
