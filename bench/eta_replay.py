"""The ETA of a finished run, replayed: from a run's state.db (`bench/plan.py --keep DIR`), the
state the run's live counters had at each second (items left, answers and their times on the
wire, requests on the wire and their ages, escalations), put through `RunStats.etas` as the
run would have, and compared with the time that was then left. Deterministic and fast: for
trying an estimator on many recorded runs without running them again.

Replayed from the attempts, ledger and items tables: a lane's adaptive limit is not recorded,
so its limit is its concurrency, and it counts as full when that many are on the wire (a lane
whose provider refused requests never reaches it, and its whole timeline counts, as for a lane
fed slowly).

Run: .venv/bin/python bench/eta_replay.py DIR... [--at 0.1[,0.5]] [--curve]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tomllib
from pathlib import Path
from typing import Any

from regen.engine.eta import Eta
from regen.engine.limiter import AdaptiveLimit
from regen.engine.stats import DatasetStats, LaneStats, RunStats


def replay(work: Path, share: float) -> dict[str, Any]:
    """The ETA (and its p10-p90) at the first second when `share` of the run's items are
    finished, the seconds then left, and every second's ETA (`curve`)."""
    job = tomllib.loads((work / "job.toml").read_text())
    lanes = job.get("lanes") or [{"name": "default", "concurrency": job["run"]["concurrency"]}]
    datasets = [d["name"] for d in job["datasets"]]
    db = sqlite3.connect(work / "out" / "state.db")
    started, ended = db.execute(
        "SELECT started_at, ended_at FROM runs WHERE kind = 'run'"
    ).fetchone()
    stats = RunStats({ds: DatasetStats() for ds in datasets}, started_at=started)
    for lane in lanes:
        c = lane["concurrency"]
        stats.lanes[lane["name"]] = LaneStats(
            c, [AdaptiveLimit(c, c)], datasets=list(datasets), escalate_to=lane.get("escalate_to")
        )
    attempts = db.execute(
        "SELECT a.item_id, i.dataset, a.lane, a.started_at, a.latency_s, a.failure_class, "
        "i.prompt_tokens_est FROM attempts a JOIN items i ON i.id = a.item_id "
        "ORDER BY a.started_at"
    ).fetchall()
    # The pilot's answers seed each flow, scaled to the prompts to come (as the scheduler does).
    earlier: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for _, ds, lane, t0, lat, fail, est in attempts:
        if t0 < started and fail is None:
            earlier.setdefault((lane, ds), []).append((lat, est))
    first_lane: dict[str, tuple[str, str, int]] = {}
    passages: dict[tuple[str, str], float] = {}
    """(item, lane) -> when its last attempt there ended."""
    for item, ds, lane, t0, lat, _, est in attempts:
        if t0 < started:
            continue
        first_lane.setdefault(item, (lane, ds, est))
        passages[item, lane] = max(t0 + lat, passages.get((item, lane), 0.0))
    status = dict(db.execute("SELECT id, status FROM items"))
    escalated_in = {
        (item, lane)
        for item, lane in db.execute(
            "SELECT item_id, lane FROM ledger WHERE kind = 'escalated' AND created_at > ?",
            (started,),
        )
    }
    pending: dict[tuple[str, str], tuple[int, int]] = {}
    for lane, ds, est in first_lane.values():
        n, e = pending.get((lane, ds), (0, 0))
        pending[lane, ds] = (n + 1, e + est)
    for (lane, ds), (n, est) in pending.items():
        stats.lanes[lane].flow(ds).remaining += n
        stats.lanes[lane].flow(ds).prompts_left += est
    for (lane, ds), answers in earlier.items():
        n, est = pending.get((lane, ds), (0, 0))
        stats.lanes[lane].flow(ds).start_from(answers[::-1], n, est)  # newest first, as stored
    for lane, ds, n, esc in db.execute(
        "SELECT l.lane, i.dataset, COUNT(*), SUM(l.kind = 'escalated') FROM ledger l "
        "JOIN items i ON i.id = l.item_id WHERE l.created_at < ? "
        "AND l.kind IN ('completion', 'escalated') GROUP BY 1, 2",
        (started,),
    ):
        flow = stats.lanes[lane].flow(ds)
        flow.answered += n
        flow.escalated += esc
    # The run's events, in time order: (time, order at a tie, kind, payload).
    events: list[tuple[float, int, str, Any]] = []
    for k, (_, ds, lane, t0, lat, fail, est) in enumerate(attempts):
        if t0 >= started:
            events.append((t0, 0, "on", (k, lane, ds, est)))
            events.append((t0 + lat, 1, "off", (k, lane, ds, lat, fail, est)))
    by_item = {item: (ds, est) for item, ds, *_, est in attempts}
    for (item, lane), end in passages.items():
        outcome = "escalated" if (item, lane) in escalated_in else status[item]
        events.append((end, 2, "outcome", (lane, *by_item[item], outcome)))
    events.sort(key=lambda e: (e[0], e[1]))
    total = len(first_lane)
    finished = 0
    out: dict[str, Any] = {"curve": []}
    next_tick = started  # the run's first progress line comes before its first request
    lane_of = {lane["name"]: lane for lane in lanes}
    for t, _, kind, payload in events:
        while next_tick <= t:
            _, job_eta = stats.etas(next_tick)
            out.setdefault("first", (job_eta, ended - next_tick))
            if job_eta is not None:
                out["curve"].append((next_tick - started, job_eta, ended - next_tick, finished))
            if job_eta is not None and "eta" not in out and finished >= share * total:
                out.update(eta=job_eta, left=ended - next_tick, at=next_tick - started)
            next_tick += 1.0
        if kind == "on":
            k, lane, ds, est = payload
            ls = stats.lanes[lane]
            ls.in_flight += 1
            ls.wire.change(t, +1)
            if ls.wire.full_since is None and ls.in_flight >= ls.concurrency:
                ls.wire.full(t)
            ls.flow(ds).on_wire[k] = t
            ls.flow(ds).wire_prompts[k] = est
        elif kind == "off":
            k, lane, ds, lat, fail, est = payload
            ls = stats.lanes[lane]
            ls.in_flight -= 1
            ls.wire.change(t, -1)
            flow = ls.flow(ds)
            del flow.on_wire[k]
            flow.wire_prompts.pop(k, None)
            if fail is None:
                flow.add_latency(lat, est)
            else:
                flow.failed_wire_s += lat
        else:
            lane, ds, est, outcome = payload
            flow = stats.lanes[lane].flow(ds)
            flow.remaining = max(0, flow.remaining - 1)
            flow.prompts_left = max(0.0, flow.prompts_left - est)
            if outcome == "escalated":
                onto = stats.lanes[lane_of[lane]["escalate_to"]].flow(ds)
                onto.remaining += 1
                onto.prompts_left += est
                flow.escalated += 1
                flow.escalated_prompts += est
                flow.escalated_timed += 1
            else:
                finished += 1
            if outcome != "failed":
                flow.answered += 1
                flow.finished += 1
    out["wall"] = ended - started
    return out


def shown(e: Eta | None) -> str:
    if e is None:
        return "-"
    return f"{e.seconds:.0f} ({e.p10:.0f}-{e.p90:.0f})" + (" prior" if e.prior else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument(
        "--at", default="0.1", help="shares of the run's items finished, comma separated"
    )
    ap.add_argument("--curve", action="store_true", help="every 5th second's ETA too")
    args = ap.parse_args()
    print(
        "| run | at | at s | ETA s (p10-p90) | left s | error | in | first ETA (p10-p90) / left |"
    )
    print("|---|---|---|---|---|---|---|---|")
    errors, held = [], []
    for d in args.dirs:
        for at in (float(x) for x in args.at.split(",")):
            r = replay(d, at)
            e, left = r["eta"], r["left"]
            err = e.seconds / left - 1
            errors.append(err)
            held.append(e.p10 <= left <= e.p90)
            first, first_left = r["first"]
            print(
                f"| {d.name} | {at:.0%} | {r['at']:.0f} | {shown(e)} | {left:.0f} | {err:+.1%} | "
                f"{'yes' if held[-1] else 'no'} | {shown(first)} / {first_left:.0f} |"
            )
            if args.curve:
                for t, eta, left_then, done in r["curve"][::5]:
                    print(
                        f"    {t:5.0f} s, {done} done: {eta.seconds:6.1f} ({eta.p10:.0f}-"
                        f"{eta.p90:.0f}) left {left_then:6.1f} {eta.seconds / left_then - 1:+.1%}"
                    )
    worst = max(max(1 + x, 1 / (1 + x)) for x in errors)
    print(
        f"{len(errors)} checks: mean abs error {statistics.mean(map(abs, errors)):.1%}, "
        f"within 20% {sum(abs(x) <= 0.2 for x in errors) / len(errors):.0%}, "
        f"worst {worst:.2f}x, interval held {sum(held) / len(held):.0%}"
    )


if __name__ == "__main__":
    main()
