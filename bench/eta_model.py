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

`--pilot`: the terms for work resting on a pilot's answers (`Flow.earlier_rse`,
EARLIER_DRIFT) on modelled jobs of two datasets in order, each started from a pilot of 30
answers; the second's times in the run drift from its pilot's by a factor exp(N(0, d)), d the
table's drift. At 10% and 25% of the items done the run is in the first dataset and the second
rests on its pilot alone. What the interval holds at d = 0 against d = EARLIER_DRIFT says how
much of its width is that allowance.

Run: .venv/bin/python bench/eta_model.py [--seeds 30]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics

from regen.engine.eta import EARLIER_DRIFT, EARLIER_RSD, Flow, lane_eta

PILOT = 30


def latency(rng: random.Random, factor: float = 1.0) -> float:
    """One answer's time on the wire, by the simulator's length model."""
    roll = rng.random()
    scale = 1.0 if roll < 0.7 else (1.8 * 1.4 if roll < 0.9 else 3.0 * 2.2 * 1.4)
    tokens = max(1, int(rng.lognormvariate(math.log(100 * scale) - 0.18, 0.6)))
    return (0.2 + tokens / 100) * factor


def packed(latencies: list[float], slots: int) -> list[tuple[float, float]]:
    """(start, end) of each item, fed to the first free slot in order."""
    free = [0.0] * slots
    out = []
    for seconds in latencies:
        start = heapq.heappop(free)
        out.append((start, start + seconds))
        heapq.heappush(free, start + seconds)
    return out


def modelled_run(seed: int, items: int, slots: int) -> list[tuple[float, float]]:
    """(start, end) of each item, fed to the first free slot in order."""
    rng = random.Random(seed)
    return packed([latency(rng) for _ in range(items)], slots)


def pilot_check(
    seed: int, items: int, slots: int, share: float, drift: float
) -> tuple[float, bool, float]:
    """A job of two datasets in order (the second's answers twice as long), each flow started
    from a pilot of PILOT answers, the second's run times drifted from its pilot's by
    exp(N(0, `drift`)): (relative error, whether p10-p90 held the actual time, relative
    interval width) at `share` of the items done."""
    rng = random.Random(seed)
    factors = (1.0, 2.0 * math.exp(rng.gauss(0.0, drift)))
    pilots = [[latency(rng, 1.0 if k == 0 else 2.0) for _ in range(PILOT)] for k in range(2)]
    half = items // 2
    times = [latency(rng, factors[0]) for _ in range(half)]
    times += [latency(rng, factors[1]) for _ in range(items - half)]
    rows = packed(times, slots)
    end = max(e for _, e in rows)
    now = sorted(e for _, e in rows)[int(share * items)]
    flows = [Flow(), Flow()]
    for flow, pilot in zip(flows, pilots, strict=True):
        flow.start_from([(t, 100) for t in pilot], items - half, 100 * (items - half))
    for k, (s, e) in enumerate(rows):
        flow = flows[k >= half]
        if e <= now:
            flow.add_latency(e - s, 100)
            flow.finished += 1
        elif s <= now:
            flow.on_wire[k] = s
            flow.wire_prompts[k] = 100
    for k, flow in enumerate(flows):
        flow.remaining = (half if k == 0 else items - half) - flow.finished
    rows_in = [(f, f.remaining, "count") for f in flows]
    eta = lane_eta(rows_in, now, float(slots), 0.0)[-1]
    assert eta is not None
    actual = end - now
    return (
        (eta.seconds - actual) / actual,
        eta.p10 <= actual <= eta.p90,
        (eta.p90 - eta.p10) / eta.seconds,
    )


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
    ap.add_argument(
        "--pilot", action="store_true", help="the terms for work resting on a pilot's answers"
    )
    args = ap.parse_args()
    if args.pilot:
        pilot_table(args.seeds)
        return
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


def pilot_table(seeds: int) -> None:
    print("| items | slots | at | pilot drift | mean error | sd | p10-p90 holds it | mean width |")
    print("|---|---|---|---|---|---|---|---|")
    for items, slots in ((3000, 64), (20000, 256)):
        for share in (0.1, 0.25):
            for drift in (0.0, EARLIER_DRIFT):
                res = [pilot_check(seed, items, slots, share, drift) for seed in range(seeds)]
                errs = [e for e, _, _ in res]
                print(
                    f"| {items} | {slots} | {share:.0%} | {drift:.0%} | "
                    f"{statistics.mean(errs):+.1%} | {statistics.stdev(errs):.1%} | "
                    f"{sum(c for _, c, _ in res) / len(res):.0%} | "
                    f"{statistics.mean(w for _, _, w in res):.0%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
