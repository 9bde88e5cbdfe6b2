"""What repeats, paid once? regen's bill on multi-turn and agent jobs (`each_turn`) and a
`samples = 4` job, against the floor and against bulk runners, on the simulated Moonshot
provider with prompt caching (kimi-k2.5: $0.6/M prompt, cache reads 0.25x); and, on a pool of
four simulated vLLM servers, the prefill computed with prefix affinity on and off.

    .venv/bin/python bench/cache_cost.py [--seeds 1 2 3] [--json]

The floor: every distinct prefix (in the provider's 64-token cache blocks; 16 on vLLM) paid
once at the prompt price, every repeat at the cache-read price, the answers at what they
cost; it is computed from the prompt token ids the simulators saw. The peers send the same
requests as a bulk runner does: in file order (and shuffled), 32 at once, no session_id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simproc import FILLER, machine_line  # noqa: E402

from regen.sim import SimConfig, sim_in_thread  # noqa: E402
from regen.sim.config import SimCache, SimFaults  # noqa: E402
from regen.sim.prefix_cache import PrefixCache  # noqa: E402
from regen.sim.server import RunningSim  # noqa: E402

MODEL = "moonshotai/kimi-k2.5"
PROMPT, READ, COMPLETION = 0.6e-6, 0.25 * 0.6e-6, 2.5e-6
"""Moonshot's kimi-k2.5 prices in the simulator: prompt, cache read, completion (USD/token)."""
POOL_MODEL = "qwen/qwen3-8b"
TIME_SCALE = 0.01
"""Real seconds per simulated second (`--time-scale`)."""
SLOWDOWN_WARN = 1.5
"""A sim slowdown (median request's time in the sim over its endpoint's) past which the table
is said to be measured on a simulator short of CPU."""
CONCURRENCY = 32
"""Requests at once on the pool, and by default on the provider."""
MAX_TOKENS = 200
PREFILL_PER_S = 5000.0
"""A simulated vLLM server's prefill speed (prompt tokens computed a second)."""
NO_FAULTS = SimFaults(
    http_5xx=0, http_408=0, reset=0, stall=0, error_200=0, midstream_error=0, cold_start=0
)
SEEN: list[list[int]] = []
"""Every prompt's token ids that reached a simulated prefix cache (the floor's input)."""


def _recording_use() -> None:
    """Record the ids each prompt brings to a simulated cache (the simulator has no hook)."""
    real = PrefixCache.use

    def use(self: PrefixCache, ids: list[int], now: float, ready: Any = None) -> Any:
        SEEN.append(list(ids))
        return real(self, ids, now, ready)

    PrefixCache.use = use  # type: ignore[method-assign]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(n))


CHATS = 16
"""Chats in the sharegpt job (`--chats`)."""


def sharegpt(rng: random.Random) -> list[dict[str, Any]]:
    """ShareGPT-like chats: a short system prompt, 10-20 turns of a few hundred words."""
    rows = []
    for i in range(CHATS):
        msgs = [{"role": "system", "content": "You are a helpful assistant."}]
        for t in range(rng.randint(10, 20)):
            msgs.append({"role": "user", "content": f"chat {i} turn {t}: " + words(rng, 60)})
            msgs.append({"role": "assistant", "content": words(rng, rng.randint(60, 160))})
        rows.append({"messages": msgs})
    return rows


def swe_agent(rng: random.Random, n: int = 6) -> list[dict[str, Any]]:
    """SWE-agent-like trajectories: one long shared system prompt, then 20-40 steps of a
    short action and a long observation."""
    system = "You are an autonomous software engineer. " + words(random.Random(0), 1500)
    rows = []
    for i in range(n):
        msgs = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"issue {i}: " + words(rng, 200)},
        ]
        for t in range(rng.randint(20, 40)):
            msgs.append({"role": "assistant", "content": f"step {t}: " + words(rng, 40)})
            msgs.append({"role": "user", "content": "OBSERVATION: " + words(rng, 150)})
        rows.append({"messages": msgs})
    return rows


def single(rng: random.Random) -> list[dict[str, Any]]:
    """Single prompts of a few hundred words (the `samples = 4` job)."""
    return [
        {"messages": [{"role": "user", "content": f"prompt {i}: " + words(rng, 400)}]}
        for i in range(40)
    ]


JOBS = {"sharegpt": (sharegpt, 1), "swe_agent": (swe_agent, 1), "samples4": (single, 4)}


def requests(rows: list[dict[str, Any]], samples: int) -> list[list[dict[str, Any]]]:
    """The prompts each_turn sends, in file order: each assistant turn's history (and the
    open last turn), `samples` times each."""
    out = []
    for row in rows:
        msgs = row["messages"]
        cuts = [j for j, m in enumerate(msgs) if m["role"] == "assistant" and j > 0]
        if msgs[-1]["role"] != "assistant":
            cuts.append(len(msgs))
        out += [msgs[:j] for j in cuts for _ in range(samples)]
    return out


def floor_split(prompts: list[list[int]], block: int) -> tuple[int, int]:
    """(computed, read) prompt tokens when every distinct prefix is kept forever: a prompt
    reads the longest run of blocks some earlier prompt had (never its last token)."""
    seen: set[int] = set()
    computed = read = 0
    for ids in prompts:
        h, run, hit = 0, 0, True
        for k in range(block, len(ids) + 1, block):
            h = hash((h, tuple(ids[k - block : k])))
            if hit and h in seen:
                run = k
            else:
                hit = False
            seen.add(h)
        cached = min(run, len(ids) - 1)
        read += cached
        computed += len(ids) - cached
    return computed, read


def with_endpoint(config: SimConfig, model: str, **changes: Any) -> SimConfig:
    """The config with the first endpoint of `model` (or the one whose tag starts with
    moonshotai) changed."""
    models = []
    for m in config.models:
        if m.id == model:
            eps = list(m.endpoints)
            i = next((k for k, e in enumerate(eps) if e.tag.startswith("moonshotai")), 0)
            eps[i] = eps[i].model_copy(update=changes)
            m = m.model_copy(update={"endpoints": eps})
        models.append(m)
    return config.model_copy(update={"models": models})


def openrouter_sim(seed: int, ttl_s: float, prefill: float = 0.0) -> SimConfig:
    """The OpenRouter sim, Moonshot's cache living `ttl_s` simulated seconds after last use,
    computing `prefill` prompt tokens a second before the first token (0: the sim's default,
    no prefill time): a prompt's blocks are readable only once it is computed."""
    config = SimConfig(
        seed=seed, time_scale=TIME_SCALE, prompt_caching=True, faults=NO_FAULTS, credits_usd=None
    )
    cache = SimCache(read_multiplier=0.25, ttl_s=ttl_s)
    return with_endpoint(config, MODEL, cache=cache, prefill_tokens_per_s=prefill)


def regen_run(
    tmp: Path,
    base_url: str,
    rows: list[dict[str, Any]],
    samples: int,
    concurrency: int,
    pilot: int = 0,
) -> tuple[float, dict[str, Any] | None]:
    """Run regen on the rows (each_turn, Moonshot only); its ledger's total, and with
    `pilot` the plan made first (`regen plan --pilot`, whose answers the run keeps)."""
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = tmp / "job.toml"
    job.write_text(
        f'[job]\noutput_dir = "{tmp / "out"}"\n\n[endpoint]\nbase_url = "{base_url}"\n'
        'api_key_env = "REGEN_BENCH_KEY"\nprovider = {only = ["moonshotai"]}\n\n'
        f'[generation]\nmodel = "{MODEL}"\nmax_tokens = {MAX_TOKENS}\nsamples = {samples}\n\n'
        f"[run]\nconcurrency = {concurrency}\nadaptive = false\nprogress_interval_s = 5\n\n"
        f'[[datasets]]\nname = "d"\npath = "{data}"\nmode = "each_turn"\n'
    )
    planned = regen_plan(job, pilot) if pilot else None
    regen("run", str(job))
    db = sqlite3.connect(tmp / "out" / "state.db")
    try:
        total = float(db.execute("SELECT SUM(cost_usd) FROM ledger").fetchone()[0] or 0.0)
    finally:
        db.close()
    return total, planned


def regen(*args: str) -> str:
    """`regen ARGS` in a subprocess; its stdout (a failure ends the bench, said)."""
    env = {**os.environ, "REGEN_BENCH_KEY": "sk-bench"}
    done = subprocess.run(
        [sys.executable, "-m", "regen", *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"regen {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def regen_plan(job: Path, pilot: int) -> dict[str, Any]:
    """`regen plan --pilot N --json`: the job's cost as planned, with the prompt cache and
    without it (what the pilot spent and every item to come)."""
    plan = json.loads(regen("plan", str(job), "--pilot", str(pilot), "--json"))
    cache = plan["job"]["caching"]
    spent = float(plan["spent_usd"])
    return {
        "pilot_usd": spent,
        "with_usd": spent + cache["with_usd"],
        "without_usd": spent + cache["without_usd"],
        "share": cache["share"],
    }


async def peer(base_url: str, prompts: list[list[dict[str, Any]]], concurrency: int) -> None:
    """A bulk runner: the prompts in the given order, `concurrency` at once, no session id."""
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": "Bearer sk-bench"}

    async def one(session: aiohttp.ClientSession, msgs: list[dict[str, Any]]) -> None:
        body = {
            "model": MODEL,
            "messages": msgs,
            "max_tokens": MAX_TOKENS,
            "provider": {"only": ["moonshotai"]},
        }
        async with gate:
            for _ in range(5):
                async with session.post(
                    f"{base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    await resp.read()
                    if resp.status == 200:
                        return

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, m) for m in prompts))


def bill(sim: RunningSim, start: int) -> dict[str, Any]:
    """The sim's bill, cache share and the floor of the prompts it saw since `start`."""
    assert sim.simulator.wait_billed(60)
    log = [e for e in sim.simulator.chat_log() if e.billed]
    prompt = sum(e.prompt_tokens for e in log)
    cached = sum(e.cached_tokens for e in log)
    computed, read = floor_split(SEEN[start:], 64)
    answers = sum(e.completion_tokens for e in log) * COMPLETION
    # The sim's own pace: a request's time in the sim against what its endpoint's time to first
    # token, prefill and speed make it. Well above 1, the sim is short of CPU and every request
    # waits for it in simulated time too (at time_scale 0.01, 10 ms of CPU is a simulated
    # second), so cache lifetimes run out while requests queue in the bench's own process.
    speed = next(
        ep.tokens_per_s
        for m in sim.simulator.config.models
        if m.id == MODEL
        for ep in m.endpoints
        if ep.tag.startswith("moonshotai")
    )
    slow = sorted(
        (e.billed_at - e.at) / TIME_SCALE / (e.ttft_s + e.completion_tokens / speed)
        for e in log
        if e.billed_at is not None
    )
    return {
        "billed_usd": sim.simulator.billed_usd(),
        "floor_usd": computed * PROMPT + read * READ + answers,
        "cached_share": cached / max(1, prompt),
        "requests": len(log),
        "sim_slowdown": slow[len(slow) // 2] if slow else 0.0,
        "sim_minutes": (max(e.billed_at or e.at for e in log) - min(e.at for e in log))
        / TIME_SCALE
        / 60,
    }


def cost_rows(
    seeds: list[int],
    tmp: Path,
    concurrency: int,
    ttl_s: float,
    pilot: int = 0,
    prefill: float = 0,
    jobs: tuple[str, ...] = tuple(JOBS),
) -> list[dict[str, Any]]:
    out = []
    for seed in seeds:
        for name, (make, samples) in JOBS.items():
            if name not in jobs:
                continue
            rows = make(random.Random(seed))
            row: dict[str, Any] = {"job": name, "seed": seed}
            with sim_in_thread(openrouter_sim(seed, ttl_s, prefill)) as sim:
                start = len(SEEN)
                work = tmp / f"{name}-{seed}"
                work.mkdir(parents=True)
                row["regen_ledger_usd"], row["plan"] = regen_run(
                    work, sim.base_url, rows, samples, concurrency, pilot
                )
                row["regen"] = bill(sim, start)
            if pilot:  # the plan against the bill: the peers are not needed
                out.append(row)
                continue
            for order in ("file", "shuffled"):
                prompts = requests(rows, samples)
                if order == "shuffled":
                    random.Random(seed).shuffle(prompts)
                with sim_in_thread(openrouter_sim(seed, ttl_s, prefill)) as sim:
                    start = len(SEEN)
                    asyncio.run(peer(sim.base_url, prompts, concurrency))
                    row[f"peer_{order}"] = bill(sim, start)
            out.append(row)
    return out


@contextmanager
def vllm_pool(seed: int) -> Iterator[list[RunningSim]]:
    config = SimConfig(seed=seed, time_scale=TIME_SCALE, dialect="vllm", served_model=POOL_MODEL)
    config = with_endpoint(config, POOL_MODEL, prefill_tokens_per_s=PREFILL_PER_S)
    with ExitStack() as stack:
        yield [stack.enter_context(sim_in_thread(config)) for _ in range(4)]


def pool_rows(seeds: list[int], tmp: Path) -> list[dict[str, Any]]:
    """The swe_agent job on four vLLM sims, prefix affinity on and off."""
    out = []
    for seed in seeds:
        rows = swe_agent(random.Random(seed), 24)
        data = tmp / f"pool-{seed}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for affinity in (True, False):
            with vllm_pool(seed) as sims:
                start = len(SEEN)
                endpoints = "".join(
                    f'[[endpoints]]\nname = "gpu{i}"\nbase_url = "{s.base_url}"\n'
                    'dialect = "vllm"\napi_key_env = "REGEN_BENCH_KEY"\n\n'
                    for i, s in enumerate(sims)
                )
                outdir = tmp / f"pool-{seed}-{affinity}"
                job = tmp / f"pool-{seed}-{affinity}.toml"
                job.write_text(
                    f'[job]\noutput_dir = "{outdir}"\n\n{endpoints}[generation]\n'
                    f'model = "{POOL_MODEL}"\nmax_tokens = {MAX_TOKENS}\n\n[run]\n'
                    f"concurrency = {CONCURRENCY}\nprefix_affinity = {str(affinity).lower()}\n"
                    f'progress_interval_s = 5\n\n[[datasets]]\nname = "d"\npath = "{data}"\n'
                    'mode = "each_turn"\n'
                )
                env = {**os.environ, "REGEN_BENCH_KEY": "none"}
                began = time.monotonic()
                done = subprocess.run(
                    [sys.executable, "-m", "regen", "run", str(job)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=False,
                )
                wall = time.monotonic() - began
                if done.returncode != 0:  # reported in the table, not hidden
                    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
                    out.append({"seed": seed, "affinity": affinity, "failed": done.returncode})
                    print(f"pool run failed ({done.returncode}): {tail}", file=sys.stderr)
                    continue
                prefill = sum(sum(s.simulator.prefill_tokens.values()) for s in sims)
                floor, _ = floor_split(SEEN[start:], 16)
                out.append(
                    {
                        "seed": seed,
                        "affinity": affinity,
                        "prefill_tokens": prefill,
                        "floor_tokens": floor,
                        "over_floor": prefill / floor - 1,
                        "wall_s": round(wall, 2),
                    }
                )
    return out


def show(cost: list[dict[str, Any]], pool: list[dict[str, Any]]) -> None:
    """The tables (markdown), each only when it has rows."""
    if cost and cost[0]["plan"] is not None:
        show_plan(cost)
    elif cost:
        show_cost(cost)
    if pool:
        show_pool(pool)


def show_cost(cost: list[dict[str, Any]]) -> None:
    print(
        "| job | ttl s | concurrency | seed | sim min | regen ledger $ | regen sim $ | floor $ | "
        "regen/floor | peer file $ | peer shuffled $ | best peer/regen | "
        "cached share regen / peer file | sim slowdown regen / peer file |"
    )
    print("| --- " * 14 + "|")
    for r in cost:
        g, f, s = r["regen"], r["peer_file"], r["peer_shuffled"]
        best = min(f["billed_usd"], s["billed_usd"])
        print(
            f"| {r['job']} | {r['ttl_s']:g} | {r['concurrency']} | {r['seed']} | "
            f"{g['sim_minutes']:.1f} | {r['regen_ledger_usd']:.4f} | {g['billed_usd']:.4f} | "
            f"{g['floor_usd']:.4f} | {g['billed_usd'] / g['floor_usd']:.2f} | "
            f"{f['billed_usd']:.4f} | {s['billed_usd']:.4f} | {best / g['billed_usd']:.2f} | "
            f"{g['cached_share']:.0%} / {f['cached_share']:.0%} | "
            f"{g['sim_slowdown']:.1f} / {f['sim_slowdown']:.1f} |"
        )
    print()
    slowest = max(
        r[who]["sim_slowdown"] for r in cost for who in ("regen", "peer_file", "peer_shuffled")
    )
    if slowest > SLOWDOWN_WARN:
        print(
            f"warning: the simulator was short of CPU (a request took up to {slowest:.1f}x its "
            "simulated time, median per run): simulated time ran on while requests waited for "
            "it, so cache lifetimes ran out that would not have; run again with a larger "
            "--time-scale\n"
        )


def show_plan(cost: list[dict[str, Any]]) -> None:
    """The plan's cost with the prompt cache (and without it) against the run's bill."""
    print(
        "| job | ttl s | seed | pilot $ | plan $ with cache | plan $ without | "
        "plan cached share | actual $ | actual cached share | plan/actual |"
    )
    print("| --- " * 10 + "|")
    for r in cost:
        p, g = r["plan"], r["regen"]
        print(
            f"| {r['job']} | {r['ttl_s']:g} | {r['seed']} | {p['pilot_usd']:.4f} | "
            f"{p['with_usd']:.4f} | {p['without_usd']:.4f} | {p['share']:.0%} | "
            f"{r['regen_ledger_usd']:.4f} | {g['cached_share']:.0%} | "
            f"{p['with_usd'] / r['regen_ledger_usd']:.3f} |"
        )
    print()


def show_pool(pool: list[dict[str, Any]]) -> None:
    print(
        "| seed | prefix affinity | prefill tokens | distinct-prefix floor | over floor | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for p in pool:
        if "failed" in p:
            print(
                f"| {p['seed']} | {'on' if p['affinity'] else 'off'} | failed: exit {p['failed']} |"
            )
            continue
        print(
            f"| {p['seed']} | {'on' if p['affinity'] else 'off'} | {p['prefill_tokens']} | "
            f"{p['floor_tokens']} | {p['over_floor']:+.0%} | {p['wall_s']} |"
        )


def main() -> None:
    global TIME_SCALE, CHATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[8],
        help="requests at once on the provider (fewer: a longer job)",
    )
    ap.add_argument(
        "--ttl",
        type=float,
        nargs="+",
        default=[300.0, 20.0],
        help="Moonshot's cache lifetime in simulated s: 300 as simulated; 20 stands for a "
        "job 15x longer (10^5 requests), whose turns of one conversation come further apart",
    )
    ap.add_argument(
        "--plan",
        type=int,
        default=0,
        metavar="N",
        help="run `regen plan --pilot N` before each regen run and compare its cost with the "
        "cache to the bill (the peers and the pool are skipped)",
    )
    ap.add_argument(
        "--prefill",
        type=float,
        default=0.0,
        help="Moonshot's prefill speed, simulated prompt tokens a second (0: none beyond its "
        "time to first token); a prompt's blocks are readable once it is computed",
    )
    ap.add_argument(
        "--pool", action=argparse.BooleanOptionalAction, default=True, help="the vLLM pool part"
    )
    ap.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    ap.add_argument(
        "--chats",
        type=int,
        default=CHATS,
        help="chats in the sharegpt job: more make a job longer than the cache's lifetime at "
        "64 at once",
    )
    ap.add_argument(
        "--time-scale",
        type=float,
        default=TIME_SCALE,
        help="real seconds per simulated second; at 64 requests at once on 2 cores, 0.01 leaves "
        "the sim short of CPU (see the table's sim slowdown) and 0.1 does not",
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    TIME_SCALE, CHATS = args.time_scale, args.chats
    _recording_use()
    if not args.json:
        print(machine_line(), flush=True)
        print(f"Moonshot's prefill: {args.prefill:g} simulated tokens/s", flush=True)
        print(f"time scale: {TIME_SCALE:g} real s per simulated s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cost = [
            {**r, "concurrency": c, "ttl_s": t}
            for t in args.ttl
            for c in args.concurrency
            for r in cost_rows(
                args.seeds, Path(tmp) / f"{c}-{t}", c, t, args.plan, args.prefill, tuple(args.jobs)
            )
        ]
        if not args.json:
            show(cost, [])
        pool = pool_rows(args.seeds, Path(tmp)) if args.pool and not args.plan else []
    if args.json:
        print(json.dumps({"cost": cost, "pool": pool}, indent=1))
        return
    show([], pool)


if __name__ == "__main__":
    main()
