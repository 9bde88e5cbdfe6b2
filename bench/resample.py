"""How honest is a mean's stated error at a given pilot size? From a finished run kept by
`bench/plan.py --keep DIR`, draw many pilots of n items of one lane and dataset (without
replacement), estimate the rest's mean per passage as `regen plan` does (Stat.regressed: the
prompt-size adjusted mean, and its standard error), and compare with the rest's actual mean.
The stated error holds if about 80% of the draws fall inside +/-1.2816 sd of the total error
(the mean's error and the spread of the items to come), and the rms of the standardized error
is about 1. No requests: deterministic (seeded) and fast.

Run: .venv/bin/python bench/resample.py DIR LANE DATASET [--field cost_usd] [--n 30,60,120,250]
     [--draws 1500]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from pathlib import Path

from regen.engine.eta import Z90, Stat
from regen.state.db import Store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path, help="a kept run (its out/state.db)")
    ap.add_argument("lane")
    ap.add_argument("dataset")
    ap.add_argument("--field", default="cost_usd", help="a FlowEntry field: cost_usd, wire_s")
    ap.add_argument("--n", default="30,60,120,250", help="pilot sizes, comma separated")
    ap.add_argument("--draws", type=int, default=1500)
    args = ap.parse_args()
    store = Store.open(args.dir / "out")
    try:
        rows = [
            (float(e.prompt_tokens_est), float(getattr(e, args.field)))
            for e in store.spend.flow_entries()
            if e.lane == args.lane and e.dataset == args.dataset
        ]
    finally:
        store.close()
    print(f"{args.dir.name} lane {args.lane} dataset {args.dataset} {args.field}: {len(rows)}")
    print("| pilot n | regressed: inside p10-p90 | rms z | sd/sqrt(n) only: inside | rms z |")
    print("|---|---|---|---|---|")
    rng = random.Random(1)
    for n in (int(x) for x in args.n.split(",")):
        stated: list[float] = []
        plain: list[float] = []
        for _ in range(args.draws):
            picked = set(rng.sample(range(len(rows)), n))
            pilot = [rows[i] for i in picked]
            rest = [rows[i] for i in range(len(rows)) if i not in picked]
            truth = sum(y for _, y in rest) / len(rest)
            x_to = sum(x for x, _ in rest) / len(rest)
            ys = [y for _, y in pilot]
            st = Stat.regressed(ys, [x for x, _ in pilot], x_to)
            stated.append((st.mean - truth) / math.hypot(st.se, st.sd / math.sqrt(len(rest))))
            pl = Stat.of(ys)
            sd = pl.sd * math.sqrt(1 / n + 1 / len(rest))
            plain.append((pl.mean - truth) / sd if sd > 0 else 0.0)

        def inside(z: list[float]) -> str:
            return f"{sum(abs(a) <= Z90 for a in z) / len(z):.0%}"

        def rms(z: list[float]) -> str:
            return f"{statistics.mean(a * a for a in z) ** 0.5:.2f}"

        print(f"| {n} | {inside(stated)} | {rms(stated)} | {inside(plain)} | {rms(plain)} |")


if __name__ == "__main__":
    main()
