"""Why a cache_cost.py run pays over the floor: each prompt's blocks the floor reads but the
simulated cache did not serve, by the reason the first of them was not readable (never
written, written but not yet computed, expired by the lifetime, evicted), and regen's own
side: when each conversation's later turns were sent against its leader's end.

    .venv/bin/python bench/cache_why.py --job sharegpt --seed 1 --concurrency 64 --ttl 20 \
        --prefill 10000 [--peer file]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_cost as cc  # noqa: E402

from regen.sim import sim_in_thread  # noqa: E402
from regen.sim.prefix_cache import PrefixCache  # noqa: E402
from regen.sim.server import Simulator  # noqa: E402

RECORDS: list[dict[str, Any]] = []
"""One per prompt that reached the cache: what it read, what the floor reads, and why not."""
_last: dict[str, Any] = {}


def instrument() -> None:
    real_use = PrefixCache.use
    ever: dict[int, float] = {}
    """Every block ever stored: its last use (sim s)."""

    def use(self: PrefixCache, ids: list[int], now: float, ready: Any = None) -> Any:
        hashes = self._hashes(ids)
        n = self.block_tokens
        floor_hit = 0
        while floor_hit < len(hashes) and hashes[floor_hit] in ever:
            floor_hit += 1
        # the state of the first block the floor reads, before the call changes it
        entries = [self._blocks.get(h) for h in hashes]
        done_at: list[float] = []

        def ready_(computed: int) -> float:
            t = ready(computed) if ready is not None else now
            done_at.append(t)
            return t

        out = real_use(self, ids, now, ready_)
        hit = out.cached // n
        cap = (len(ids) - 1) // n
        floor_read = min(floor_hit, cap)
        reason, detail = "none", 0.0
        if hit < floor_read:
            h, entry = hashes[hit], entries[hit]
            if entry is not None and entry[1] > now:
                reason, detail = "not yet computed", entry[1] - now
            elif entry is not None and self.ttl_s is not None and now - entry[0] > self.ttl_s:
                reason, detail = "expired", now - entry[0]
            elif entry is None and self.ttl_s is not None and now - ever[h] > self.ttl_s:
                reason, detail = "expired", now - ever[h]
            elif entry is None:
                reason, detail = "evicted", now - ever[h]
            else:
                reason = "other"
        for h in hashes:
            ever[h] = now
        _last.update(
            now=now,
            tokens=len(ids),
            cached=out.cached,
            floor_cached=floor_read * n,
            lost=max(0, floor_read - hit) * n,
            reason=reason,
            detail=detail,
            conv=hash(tuple(ids[:128])),
            ready_at=done_at[0] if done_at else now,
            used_wall=time.time(),
        )
        return out

    PrefixCache.use = use  # type: ignore[method-assign]
    real_price = Simulator._cache_and_price

    def price(self: Simulator, chat: Any, endpoint: Any) -> Any:
        _last.clear()
        out = real_price(self, chat, endpoint)
        if _last:
            RECORDS.append({**_last, "entry": chat.entry})
        return out

    Simulator._cache_and_price = price  # type: ignore[method-assign]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    lost = Counter()
    count = Counter()
    details: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["lost"]:
            lost[r["reason"]] += r["lost"]
            count[r["reason"]] += 1
            details[r["reason"]].append(r["detail"])
    prompt = sum(r["tokens"] for r in records)
    floor_cached = sum(r["floor_cached"] for r in records)
    cached = sum(r["cached"] for r in records)
    excess = sum(lost.values()) * (cc.PROMPT - cc.READ)
    return {
        "requests": len(records),
        "prompt_tokens": prompt,
        "cached": cached,
        "floor_cached": floor_cached,
        "lost_tokens_by_reason": dict(lost),
        "requests_by_reason": dict(count),
        "detail_s_median_by_reason": {k: sorted(v)[len(v) // 2] for k, v in details.items()},
        "excess_usd": excess,
    }


def regen_side(db_path: Path, records: list[dict[str, Any]]) -> None:
    """Per conversation, in simulated s: the time from its leader's prompt reaching the cache
    to its first follower's, in parts (the leader's rest in the sim, regen seeing its end,
    regen sending the follower, the follower reaching the sim, the sim reaching its prompt),
    and the prompt tokens its requests computed beyond the floor."""
    by_gen = {r["entry"].generation_id: r for r in records}
    db = sqlite3.connect(db_path)
    rows = db.execute(
        "SELECT a.generation_id, a.started_at, a.latency_s, i.conversation_id "
        "FROM attempts a JOIN items i ON i.id = a.item_id"
    ).fetchall()
    db.close()
    convs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for gen, started, latency, cid in rows:
        if gen in by_gen:
            convs[cid].append({**by_gen[gen], "start": started, "end": started + latency})
    scale = cc.TIME_SCALE
    parts = defaultdict(list)
    names = (
        "lead cache->billed",
        "billed->regen end",
        "regen end->sent",
        "sent->sim",
        "sim->cache",
        "total",
    )
    print("conversation | " + " | ".join(names) + " | lost tokens, reasons")
    for cid, reqs in sorted(convs.items(), key=lambda kv: min(r["start"] for r in kv[1])):
        reqs.sort(key=lambda r: r["start"])
        lead, rest = reqs[0], reqs[1:]
        if not rest:
            continue
        f = min(rest, key=lambda r: r["used_wall"])
        e = lead["entry"]
        gaps = (
            (e.billed_at - lead["used_wall"]) / scale,
            (lead["end"] - e.billed_at) / scale,
            (f["start"] - lead["end"]) / scale,
            (f["entry"].at - f["start"]) / scale,
            (f["used_wall"] - f["entry"].at) / scale,
            (f["used_wall"] - lead["used_wall"]) / scale,
        )
        for name, g in zip(names, gaps, strict=True):
            parts[name].append(g)
        reasons = Counter(r["reason"] for r in reqs if r["lost"])
        print(
            f"{cid[:8]} | "
            + " | ".join(f"{g:5.1f}" for g in gaps)
            + f" | {sum(r['lost'] for r in reqs)} {dict(reasons)}"
        )
    print("median | " + " | ".join(f"{sorted(v)[len(v) // 2]:5.1f}" for v in parts.values()))


def cpu_s() -> tuple[float, float]:
    """CPU seconds so far of this process (the bench and the sim) and of its children."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", default="sharegpt", choices=list(cc.JOBS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--ttl", type=float, default=20.0)
    ap.add_argument("--prefill", type=float, default=10000.0)
    ap.add_argument(
        "--time-scale",
        type=float,
        default=cc.TIME_SCALE,
        help="real seconds per simulated second (larger: the sim's CPU per request is fewer "
        "simulated seconds)",
    )
    ap.add_argument("--peer", choices=["file", "shuffled"], default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep regen's output here")
    ap.add_argument("--records", type=Path, default=None, help="write per-request records")
    args = ap.parse_args()
    cc.TIME_SCALE = args.time_scale
    instrument()
    cc._recording_use()
    make, samples = cc.JOBS[args.job]
    rows = make(random.Random(args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with sim_in_thread(cc.openrouter_sim(args.seed, args.ttl, args.prefill)) as sim:
            start = len(cc.SEEN)
            if args.peer:
                prompts = cc.requests(rows, samples)
                if args.peer == "shuffled":
                    random.Random(args.seed).shuffle(prompts)
                asyncio.run(cc.peer(sim.base_url, prompts, args.concurrency))
            else:
                (me0, kids0), w0 = cpu_s(), time.time()
                cc.regen_run(work, sim.base_url, rows, samples, args.concurrency)
                (me1, kids1), w1 = cpu_s(), time.time()
                print(
                    f"wall {w1 - w0:.2f} s, CPU s: regen {kids1 - kids0:.2f}, "
                    f"the bench and the sim {me1 - me0:.2f}"
                )
            b = cc.bill(sim, start)
        s = summary(RECORDS)
        print(
            f"billed {b['billed_usd']:.4f} floor {b['floor_usd']:.4f} "
            f"ratio {b['billed_usd'] / b['floor_usd']:.3f} sim min {b['sim_minutes']:.2f} "
            f"sim slowdown {b['sim_slowdown']:.1f}"
        )
        print(json.dumps(s, indent=1))
        if not args.peer:
            regen_side(work / "out" / "state.db", RECORDS)
        if args.records:
            args.records.write_text(
                json.dumps(
                    [
                        {k: v for k, v in r.items() if k != "entry"}
                        | {
                            "gen": r["entry"].generation_id,
                            "at": r["entry"].at,
                            "billed_at": r["entry"].billed_at,
                            "used_wall": r["used_wall"],
                            "ttft_s": r["entry"].ttft_s,
                            "completion_tokens": r["entry"].completion_tokens,
                        }
                        for r in RECORDS
                    ]
                )
            )


if __name__ == "__main__":
    main()
