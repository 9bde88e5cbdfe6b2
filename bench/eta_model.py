"""The ETA estimator on modelled runs: fast, deterministic, many seeds and sizes.

A run is modelled as C slots fed in order with items whose latencies follow the simulator's
length model (70% short prompts, 20% with two length hints, 10% long prompts with many hints;
log-normal token counts, sigma 0.6, at 100 tokens/s plus 0.2 s to the first token). At 10%,
25% and 50% of items done, the state a run would see (finished latencies, requests on the wire
with their age) goes through regen.engine.eta.lane_eta, and the estimate is compared with the
time the modelled run then took; and the first ETA of a rerun after a kill -9 there (the
killed run's answers, the requests it was killed with at their age, its pace; nothing on the
wire) against the time the rerun takes. The sizes span few items per slot (the end decided by
a handful of long answers) to many.

Run: .venv/bin/python bench/eta_model.py [--seeds 30]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics

from regen.engine.eta import EARLIER_RSD, Flow, lane_eta


def modelled_run(seed: int, items: int, slots: int) -> list[tuple[float, float]]:
    """(start, end) of each item, fed to the first free slot in order."""
    rng = random.Random(seed)
    free = [0.0] * slots
    out = []
    for _ in range(items):
        roll = rng.random()
        scale = 1.0 if roll < 0.7 else (1.8 * 1.4 if roll < 0.9 else 3.0 * 2.2 * 1.4)
        tokens = max(1, int(rng.lognormvariate(math.log(100 * scale) - 0.18, 0.6)))
        start = heapq.heappop(free)
        end = start + 0.2 + tokens / 100
        out.append((start, end))
        heapq.heappush(free, end)
    return out


def check(rows: list[tuple[float, float]], slots: int, share: float) -> tuple[float, bool, float]:
    """(relative error, whether p10-p90 held the actual time, relative interval width)."""
    end = max(e for _, e in rows)
    now = sorted(e for _, e in rows)[int(share * len(rows))]
    flow = Flow()
    done = 0
    for k, (s, e) in enumerate(rows):
        if e <= now:
            flow.add_latency(e - s)
            done += 1
        elif s <= now:
            flow.on_wire[k] = s
    flow.remaining = len(rows) - done
    flow.finished = done  # every answer is this run's
    (eta,) = lane_eta([(flow, flow.remaining, "count")], now, float(slots), 0.0)
    assert eta is not None
    actual = end - now
    return (
        (eta.seconds - actual) / actual,
        eta.p10 <= actual <= eta.p90,
        (eta.p90 - eta.p10) / eta.seconds,
    )


def restart_check(rows: list[tuple[float, float]], slots: int, share: float) -> tuple[float, bool]:
    """A kill -9 at `share` of the items done and a rerun: its first ETA (nothing of its own
    on the wire yet; the killed run's answers and pace, known to EARLIER_RSD) against the time
    the rerun then takes to send what was left, in order, on as many slots."""
    now = sorted(e for _, e in rows)[int(share * len(rows))]
    flow = Flow()
    left = []
    for s, e in rows:
        if e <= now:
            flow.add_latency(e - s)
        else:
            left.append(e - s)  # in flight at the kill: sent again in full
            if s <= now:
                flow.cut_short.append(now - s)
    flow.remaining = len(left)
    free = [0.0] * slots
    for latency in left:
        heapq.heappush(free, heapq.heappop(free) + latency)
    actual = max(free)
    (eta,) = lane_eta([(flow, flow.remaining, "count")], now, float(slots), EARLIER_RSD)
    assert eta is not None and not eta.prior
    return (eta.seconds - actual) / actual, eta.p10 <= actual <= eta.p90


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    args = ap.parse_args()
    print(
        "| items | slots | items per slot | at | mean error | sd | max abs error "
        "| p10-p90 holds it | mean width | restart: mean error | max abs | p10-p90 holds it |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for items, slots in ((3000, 64), (20000, 256), (20000, 64), (100000, 256)):
        runs = [modelled_run(seed, items, slots) for seed in range(args.seeds)]
        for share in (0.1, 0.25, 0.5):
            res = [check(r, slots, share) for r in runs]
            restarts = [restart_check(r, slots, share) for r in runs]
            errs = [e for e, _, _ in res]
            print(
                f"| {items} | {slots} | {items // slots} | {share:.0%} | "
                f"{statistics.mean(errs):+.1%} | {statistics.stdev(errs):.1%} | "
                f"{max(map(abs, errs)):.1%} | {sum(c for _, c, _ in res) / len(res):.0%} | "
                f"{statistics.mean(w for _, _, w in res):.0%} | "
                f"{statistics.mean(e for e, _ in restarts):+.1%} | "
                f"{max(abs(e) for e, _ in restarts):.1%} | "
                f"{sum(c for _, c in restarts) / len(restarts):.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
