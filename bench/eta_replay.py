"""The ETA of a finished run, replayed: from a run's state.db (`bench/plan.py --keep DIR`,
`bench/realistic.py --keep DIR`), the state the run's live counters had at each second (items
left, answers and their times on the wire and bills, requests on the wire and their ages,
escalations, what the job's dollar cap and the datasets' budgets still allow), put through
`RunStats.etas` as the run would have, and compared with the time that was then left.
Deterministic and fast: for trying an estimator on many recorded runs without running them
again.

Replayed from the attempts, ledger and items tables, of the job's last run that ended (a
killed run before it counts as an earlier run: its answers and bills seed the flows, as a
rerun's own do). A lane's adaptive limit is not recorded, so its limit is its concurrency,
and it counts as full when that many are on the wire (a lane whose provider refused requests
never reaches it, and its whole timeline counts, as for a lane fed slowly). A request's worst
case against the cap is not recorded either: it is taken as four bytes to a prompt token plus
the template's 256 (`prompt_tokens_bound`) at the simulator's prices and the lane's
max_tokens, as is the worst case a killed run's request holds until its bill is found.

Run: .venv/bin/python bench/eta_replay.py DIR... [--at 0.1[,0.5]] [--curve]
     .venv/bin/python bench/eta_replay.py DIR/realistic-* --checks FILE.json
       (bench/realistic.py's --json: each check made in the last run, live against replayed)
"""

from __future__ import annotations

import argparse
import bisect
import json
import sqlite3
import statistics
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regen.engine.eta import Eta
from regen.engine.limiter import AdaptiveLimit
from regen.engine.stats import DatasetStats, LaneStats, RunStats
from regen.state.runs import Runs


class Bills:
    """The ledger in time order: what had been charged by a time, for the job and per dataset
    (dollars, and tokens as the datasets' budgets count them)."""

    def __init__(self, db: sqlite3.Connection, count_total: bool) -> None:
        self.times: dict[str | None, list[float]] = {None: []}
        self.usd: dict[str | None, list[float]] = {None: [0.0]}
        self.tokens: dict[str | None, list[float]] = {None: [0.0]}
        for t, ds, usd, p, c in db.execute(
            "SELECT created_at, dataset, COALESCE(cost_usd, 0), prompt_tokens, "
            "completion_tokens FROM ledger ORDER BY created_at"
        ):
            for key in (None, ds):
                self.times.setdefault(key, []).append(t)
                self.usd.setdefault(key, [0.0]).append(self.usd[key][-1] + usd)
                counted = p + c if count_total else c
                self.tokens.setdefault(key, [0.0]).append(self.tokens[key][-1] + counted)

    def by(self, t: float, dataset: str | None = None) -> tuple[float, float]:
        """Tokens and dollars charged before `t` (the job's, or a dataset's)."""
        k = bisect.bisect_left(self.times.get(dataset, []), t)
        return self.tokens.get(dataset, [0.0])[k], self.usd.get(dataset, [0.0])[k]


def prices(db: sqlite3.Connection) -> tuple[float, float]:
    """The dollars of a prompt and of a completion token, fitted to the ledger's bills (least
    squares through the origin; the simulator charges list prices)."""
    spp = spc = scc = sup = suc = 0.0
    for p, c, usd in db.execute(
        "SELECT prompt_tokens, completion_tokens, cost_usd FROM ledger WHERE cost_usd > 0 "
        "AND cached_tokens = 0 AND cache_write_tokens = 0"
    ):
        spp, spc, scc = spp + p * p, spc + p * c, scc + c * c
        sup, suc = sup + usd * p, suc + usd * c
    det = spp * scc - spc * spc
    if det <= 0:
        return 0.0, 0.0
    return (sup * scc - suc * spc) / det, (suc * spp - sup * spc) / det


def last_run(db: sqlite3.Connection) -> tuple[int, float, float]:
    """The job's last run that ended: its id, start and end (epoch seconds)."""
    run_id, started, ended = db.execute(
        "SELECT id, started_at, ended_at FROM runs WHERE kind = 'run' AND ended_at IS NOT NULL "
        "ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return run_id, started, ended


def replay(work: Path, shares: list[float], times: Sequence[float] = ()) -> dict[str, Any]:
    """The ETA (and its p10-p90) at the first second when each of `shares` of the run's items
    are finished, and at each of `times` (epoch seconds), with the seconds then left; every
    second's ETA (`curve`). The run is the job's last run that ended."""
    job = tomllib.loads((work / "job.toml").read_text())
    lanes = job.get("lanes") or [{"name": "default", "concurrency": job["run"]["concurrency"]}]
    datasets = [d["name"] for d in job["datasets"]]
    db = sqlite3.connect(work / "out" / "state.db")
    run_id, started, ended = last_run(db)
    stats = RunStats({ds: DatasetStats() for ds in datasets}, started_at=started)
    # The pace a rerun starts from: the runs' before it (a killed one's), as regen reads it.
    paces = Runs(db, None).earlier_on_wire(before=run_id)  # reads only: no transaction
    for lane in lanes:
        c = lane["concurrency"]
        stats.lanes[lane["name"]] = LaneStats(
            c, [AdaptiveLimit(c, c)], datasets=list(datasets), escalate_to=lane.get("escalate_to")
        )
        if lane["name"] in paces:
            stats.lanes[lane["name"]].wire.earlier = paces[lane["name"]]
    clock = [started]
    count_total = job.get("budget", {}).get("budget_tokens") == "total"
    worst, wire = budgets(job, db, stats, clock, count_total)
    attempts = db.execute(
        "SELECT a.item_id, i.dataset, a.lane, a.started_at, a.latency_s, a.failure_class, "
        "i.prompt_tokens_est FROM attempts a JOIN items i ON i.id = a.item_id "
        "ORDER BY a.started_at"
    ).fetchall()
    bills = seed(db, stats, started, attempts, count_total)
    lane_of = {lane["name"]: lane for lane in lanes}
    events = timeline(db, started, attempts)
    total = sum(flow.remaining for ls in stats.lanes.values() for flow in ls.flows.values())
    finished = 0
    out: dict[str, Any] = {"curve": [], "at": {}}
    wanted = sorted([(t, f"{t - started:.0f} s") for t in times])
    next_tick = started  # the run's first progress line comes before its first request
    for t, _, kind, payload in [*events, (ended + 1.0, 9, "end", None)]:
        while next_tick <= t or (wanted and wanted[0][0] <= t):
            now = next_tick if not wanted or next_tick <= wanted[0][0] else wanted[0][0]
            clock[0] = now
            _, job_eta = stats.etas(now)
            out.setdefault("first", (job_eta, ended - now))
            if wanted and now == wanted[0][0]:
                out["at"][wanted.pop(0)[1]] = (job_eta, ended - now, now - started)
                continue
            if job_eta is not None:
                out["curve"].append((now - started, job_eta, ended - now, finished))
                for share in shares:
                    if f"{share:.0%}" not in out["at"] and finished >= share * total:
                        out["at"][f"{share:.0%}"] = (job_eta, ended - now, now - started)
            next_tick += 1.0
        if kind == "end":
            break
        finished += step(stats, lane_of, (worst, wire), t, kind, payload, bills)
    out["wall"], out["started"] = ended - started, started
    return out


def budgets(
    job: dict[str, Any],
    db: sqlite3.Connection,
    stats: RunStats,
    clock: list[float],
    count_total: bool,
) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """What the job's dollar cap and each dataset's budgets allow at the replay's time
    (`clock`), set on `stats` as the run's budget book does. Returns the prices of a
    request's worst case (a prompt token's, and each lane's completion at its max_tokens),
    and the worst cases of the requests on the wire per dataset, which `step` keeps."""
    bills = Bills(db, count_total)
    cap = job.get("budget", {}).get("max_cost_usd")
    per_ds = {d["name"]: (d.get("token_budget"), d.get("max_cost_usd")) for d in job["datasets"]}
    prompt_price, completion_price = prices(db)
    wire: dict[str, dict[int, float]] = {}
    default = job.get("generation", {}).get("max_tokens") or 0
    worst = {
        lane["name"]: (lane.get("max_tokens") or default) * completion_price
        for lane in job.get("lanes") or [{"name": "default"}]
    }
    # An earlier run's requests cut short by its kill hold their worst cases against the caps
    # until their bills are found (`engine.holds`): those found in this run, until then.
    unit = {"prompt": prompt_price, **worst}
    holds = [
        (found, ds, worst_case(unit, lane, est))
        for found, ds, lane, est in db.execute(
            "SELECT l.created_at, l.dataset, l.lane, i.prompt_tokens_est FROM ledger l "
            "JOIN items i ON i.id = l.item_id WHERE l.kind = 'lost' AND l.created_at >= ?",
            (clock[0],),
        )
    ]

    def held(ds: str | None) -> float:
        return sum(usd for found, name, usd in holds if clock[0] < found and ds in (None, name))

    def reserved(ds: str | None) -> tuple[float, float]:
        tokens = usd = 0.0
        for ls in stats.lanes.values():
            for name, flow in ls.flows.items():
                if ds is None or name == ds:
                    tokens += len(flow.on_wire) * (flow.tokens_per_item() or 0.0)
        for name, on_wire in wire.items():
            if ds is None or name == ds:
                usd += sum(on_wire.values())
        return tokens, usd

    def job_usd_left() -> float | None:
        return None if cap is None else max(0.0, cap - bills.by(clock[0])[1] - held(None))

    def budget_left(ds: str) -> tuple[float | None, float | None]:
        token_budget, usd_cap = per_ds[ds]
        spent_tokens, spent_usd = bills.by(clock[0], ds)
        wire_tokens, wire_usd = reserved(ds)
        tokens = usd = None
        if token_budget is not None:
            tokens = max(0.0, token_budget - spent_tokens - wire_tokens)
        if usd_cap is not None:
            usd = max(0.0, usd_cap - spent_usd - held(ds))
        if cap is not None:
            room = max(0.0, cap - bills.by(clock[0])[1] - reserved(None)[1] - held(None))
            usd = room if usd is None else min(usd, room)
        return tokens, usd

    stats.job_usd_left = job_usd_left
    stats.budget_left = budget_left
    return (unit if cap is not None else {}), wire


def worst_case(unit: dict[str, float], lane: str, prompt_est: int) -> float:
    """What the caps hold for a request of the lane (`unit`: a prompt token's price, and each
    lane's completion at its max_tokens): its prompt bounded as `prompt_tokens_bound` does, at
    about four bytes a token and the template's 256."""
    return (256 + 4 * prompt_est) * unit["prompt"] + unit.get(lane, 0.0)


def seed(
    db: sqlite3.Connection,
    stats: RunStats,
    started: float,
    attempts: list[tuple[Any, ...]],
    count_total: bool,
) -> dict[tuple[str, str], tuple[float, float]]:
    """Each flow as the run found it (its items pending then, earlier runs' answers' times,
    bills and escalations, as `engine.scheduler.seed_stats` reads them); returns this run's
    bills per (item, lane): dollars and counted tokens."""
    done_before = {
        item
        for (item,) in db.execute(
            "SELECT item_id FROM ledger WHERE kind = 'completion' AND created_at < ?", (started,)
        )
    } | {
        item
        for (item,) in db.execute(
            "SELECT id FROM items WHERE status = 'failed' AND updated_at < ?", (started,)
        )
    }
    escalated_before = dict(
        db.execute(
            "SELECT item_id, lane FROM ledger WHERE kind = 'escalated' AND created_at < ?",
            (started,),
        ).fetchall()
    )
    first_in_run: dict[str, str] = {}
    earlier: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for item, ds, lane, t0, lat, fail, est in attempts:
        if t0 >= started:
            first_in_run.setdefault(item, lane)
        elif fail is None:
            earlier.setdefault((lane, ds), []).append((lat, est))
    pending: dict[tuple[str, str], tuple[int, int]] = {}
    for item, ds, lane, est in db.execute(
        "SELECT id, dataset, lane, prompt_tokens_est FROM items WHERE gone = 0"
    ):
        if item in done_before:
            continue
        if item in escalated_before:
            lane = stats.lanes[escalated_before[item]].escalate_to
        lane = first_in_run.get(item, lane)
        if lane not in stats.lanes:  # a lane the job no longer has: not in the run's view
            continue
        n, e = pending.get((lane, ds), (0, 0))
        pending[lane, ds] = (n + 1, e + est)
    for (lane, ds), (n, est) in pending.items():
        stats.lanes[lane].flow(ds).remaining += n
        stats.lanes[lane].flow(ds).prompts_left += est
    for (lane, ds), answers in earlier.items():
        n, est = pending.get((lane, ds), (0, 0))
        stats.lanes[lane].flow(ds).start_from(answers[::-1], n, est)  # newest first, as stored
    bills: dict[tuple[str, str], tuple[float, float]] = {}
    for item, lane, ds, kind, usd, p, c, t, est in db.execute(
        "SELECT l.item_id, l.lane, l.dataset, l.kind, l.cost_usd, l.prompt_tokens, "
        "l.completion_tokens, l.created_at, i.prompt_tokens_est FROM ledger l "
        "JOIN items i ON i.id = l.item_id WHERE l.lane IS NOT NULL "
        "AND l.kind IN ('completion', 'escalated') ORDER BY l.id"
    ):
        counted = p + c if count_total else c
        if t >= started:
            bills[item, lane] = (usd or 0.0, counted)
            continue
        flow = stats.lanes[lane].flow(ds)
        flow.answered += 1
        flow.escalated += kind == "escalated"
        flow.earlier_cost_usd += usd or 0.0
        flow.earlier_tokens += counted
        if usd is not None:
            flow.add_priced(est, usd)
    return bills


def timeline(
    db: sqlite3.Connection, started: float, attempts: list[tuple[Any, ...]]
) -> list[tuple[float, int, str, Any]]:
    """The run's events in time order: (time, order at a tie, kind, payload): each attempt
    going on the wire and coming off it, and each item's outcome in each lane (when its last
    attempt there ended)."""
    passages: dict[tuple[str, str], float] = {}
    """(item, lane) -> when its last attempt there ended."""
    for item, _, lane, t0, lat, _, _ in attempts:
        if t0 >= started:
            passages[item, lane] = max(t0 + lat, passages.get((item, lane), 0.0))
    status = dict(db.execute("SELECT id, status FROM items"))
    escalated_in = {
        (item, lane)
        for item, lane in db.execute(
            "SELECT item_id, lane FROM ledger WHERE kind = 'escalated' AND created_at >= ?",
            (started,),
        )
    }
    events: list[tuple[float, int, str, Any]] = []
    for k, (_, ds, lane, t0, lat, fail, est) in enumerate(attempts):
        if t0 >= started:
            events.append((t0, 0, "on", (k, lane, ds, est)))
            events.append((t0 + lat, 1, "off", (k, lane, ds, lat, fail, est)))
    by_item = {item: (ds, est) for item, ds, *_, est in attempts}
    for (item, lane), end in passages.items():
        outcome = "escalated" if (item, lane) in escalated_in else status[item]
        if outcome != "pending":  # a request the stop cut short: the item is still to do
            events.append((end, 2, "outcome", (item, lane, *by_item[item], outcome)))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def step(
    stats: RunStats,
    lane_of: dict[str, dict[str, Any]],
    caps: tuple[dict[str, float], dict[str, dict[int, float]]],
    t: float,
    kind: str,
    payload: Any,
    bills: dict[tuple[str, str], tuple[float, float]],
) -> int:
    """One event through the run's counters; returns 1 if an item finished."""
    if kind == "on":
        k, lane, ds, est = payload
        ls = stats.lanes[lane]
        ls.in_flight += 1
        ls.wire.change(t, +1)
        if ls.wire.full_since is None and ls.in_flight >= ls.concurrency:
            ls.wire.full(t)
        flow = ls.flow(ds)
        flow.on_wire[k] = t
        flow.wire_prompts[k] = est
        unit, wire = caps
        if unit:
            usd = wire.setdefault(ds, {})[k] = worst_case(unit, lane, est)
            ls.worst_usd.append(usd)
        return 0
    if kind == "off":
        k, lane, ds, lat, fail, est = payload
        ls = stats.lanes[lane]
        ls.in_flight -= 1
        ls.wire.change(t, -1)
        flow = ls.flow(ds)
        del flow.on_wire[k]
        flow.wire_prompts.pop(k, None)
        caps[1].get(ds, {}).pop(k, None)
        if fail is None:
            flow.add_latency(lat, est)
        else:
            flow.failed_wire_s += lat
        return 0
    item, lane, ds, est, outcome = payload
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
    if outcome != "failed":
        flow.answered += 1
        flow.finished += 1
        usd, counted = bills.get((item, lane), (0.0, 0.0))
        flow.cost_usd += usd
        flow.tokens += counted
        if (item, lane) in bills:
            flow.add_priced(est, usd)
    return int(outcome != "escalated")


def shown(e: Eta | None) -> str:
    if e is None:
        return "-"
    return f"{e.seconds:.0f} ({e.p10:.0f}-{e.p90:.0f})" + (" prior" if e.prior else "")


RESTART_SLACK_S = 5.0
"""How long before the last run's start a check still counts as its first line."""


def live_checks(work: Path, path: Path | None) -> dict[str, tuple[float, Eta]]:
    """bench/realistic.py's checks of this job (its --json) made in the job's last run: their
    label, their time (epoch seconds) and the ETA the run showed."""
    if path is None:
        return {}
    seed = int(work.name.rsplit("-", 1)[-1])
    db = sqlite3.connect(work / "out" / "state.db")
    _, started, ended = last_run(db)
    out = {}
    for r in json.loads(path.read_text()):
        if r["seed"] != seed:
            continue
        for label, c in r["checks"].items():
            # A check on a restart is its run's first line, timed by the bench from a moment
            # before the run's start; a check more than a few seconds before it was made in an
            # earlier run.
            at = ended - c["left"]
            if at >= started - RESTART_SLACK_S and c.get("eta") is not None:
                out[label] = (max(at, started), Eta(c["eta"], c["p10"], c["p90"], ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument(
        "--at", default="0.1", help="shares of the run's items finished, comma separated"
    )
    ap.add_argument(
        "--checks", type=Path, help="bench/realistic.py's --json: replay its checks' times"
    )
    ap.add_argument("--curve", action="store_true", help="every 5th second's ETA too")
    args = ap.parse_args()
    shares = [] if args.checks else [float(x) for x in args.at.split(",")]
    last = "live ETA (error)" if args.checks else "first ETA (p10-p90) / left"
    print(f"| run | at | at s | ETA s (p10-p90) | left s | error | in | {last} |")
    print("|---|---|---|---|---|---|---|---|")
    errors, held = [], []
    for d in args.dirs:
        live = live_checks(d, args.checks)
        r = replay(d, shares, [t for t, _ in live.values()])
        labels = {f"{t - r['started']:.0f} s": label for label, (t, _) in live.items()}
        for at, (e, left, at_s) in r["at"].items():
            err = e.seconds / left - 1
            errors.append(err)
            held.append(e.p10 <= left <= e.p90)
            first, first_left = r["first"]
            shown_live = f"{shown(first)} / {first_left:.0f}"
            if at in labels:
                was = live[labels[at]][1]
                shown_live = f"{shown(was)} ({was.seconds / left - 1:+.1%})"
            print(
                f"| {d.name} | {labels.get(at, at)} | {at_s:.0f} | {shown(e)} | {left:.0f} | "
                f"{err:+.1%} | {'yes' if held[-1] else 'no'} | {shown_live} |"
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
