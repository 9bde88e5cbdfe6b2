"""`regen plan`: estimates before spending, checked against what the run then measures."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from regen.config import Job, load_job
from regen.demo import prepare_demo
from regen.engine.budget import Prices
from regen.run.forecast import Interval, plan
from regen.sim import SimConfig, sim_in_thread
from regen.state.spend import FlowEntry
from regen.state.work import DatasetProgress
from tests.conftest import (
    chat_rows,
    query,
    refusing_sim,
    run_cli,
    two_lanes,
    write_job,
    write_rows,
)


def spent(out: Path) -> dict[str, tuple[int, float]]:
    rows = query(
        out, "SELECT dataset, SUM(completion_tokens), SUM(cost_usd) FROM ledger GROUP BY dataset"
    )
    return {d: (int(t), float(c)) for d, t, c in rows}


def demo_job(tmp: Path, base_url: str) -> Path:
    job = prepare_demo(tmp / "demo")
    job.write_text(
        job.read_text()
        .replace("http://127.0.0.1:8787/api/v1", base_url)
        .replace('"OPENROUTER_API_KEY"', '"REGEN_TEST_KEY"')
    )
    return job


def test_plan_with_a_pilot_estimates_the_demo_run_within_25_percent(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=7, time_scale=0.05, credits_usd=50.0)) as sim:
        job = demo_job(tmp_path, sim.base_url)
        plan = run_cli("plan", str(job), "--pilot", "30", "--json")
        assert plan.returncode == 0, plan.stderr
        after_pilot = len(sim.simulator.chat_log())
        before = spent(tmp_path / "demo")
        run = run_cli("run", str(job))
        assert run.returncode == 0, run.stderr
    assert after_pilot == 90  # 30 per dataset, kept for the run
    estimates = json.loads(plan.stdout)
    after = spent(tmp_path / "demo")
    assert 49.0 < estimates["credit_usd"] < 50.0
    assert (
        estimates["coverage"].startswith("$49.9")
        and "covers every dataset" in (estimates["coverage"])
    )
    expected = measured = 0.0
    for e in estimates["datasets"]:
        assert e["basis"] == "30 answers" and e["pending"] == e["sent"] == e["items"] - 30
        tokens = after[e["name"]][0] - before[e["name"]][0]
        cost = after[e["name"]][1] - before[e["name"]][1]
        # 30 answers of a skewed length distribution: each dataset within 25%.
        assert abs(e["completion_tokens"] / tokens - 1) < 0.25, (e, tokens)
        assert abs(e["cost_usd"]["mean"] / cost - 1) < 0.25, (e, cost)
        assert e["cost_usd"]["p10"] < e["cost_usd"]["mean"] < e["cost_usd"]["p90"]
        expected += e["cost_usd"]["mean"]
        measured += cost
    assert abs(expected / measured - 1) < 0.25
    job = estimates["job"]
    assert job["cost_usd"]["mean"] == pytest.approx(expected)
    assert job["time_s"]["p10"] <= job["time_s"]["mean"] <= job["time_s"]["p90"]
    assert "every item is expected to finish" in job["stop"]


def test_plan_without_answers_says_what_it_assumes_and_sends_nothing(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=7, time_scale=0.0)) as sim:
        job = demo_job(tmp_path, sim.base_url)
        job.write_text(
            job.read_text().replace('name = "code"', 'name = "code"\ntoken_budget = 2000')
        )
        plan = run_cli("plan", str(job))
        as_json = run_cli("plan", str(job), "--json")
        assert sim.simulator.chat_log() == []
    assert plan.returncode == 0, plan.stderr
    p = json.loads(as_json.stdout)
    assert {d["basis"] for d in p["datasets"]} == {
        "no answers: prior (max_tokens x 0.25, 50 tok/s)"
    }
    assert "pass --pilot N to measure them" in plan.stdout
    # code: 80 items of 512 expected tokens each, a budget of 2000: about 4 of them go out.
    code = next(d for d in p["datasets"] if d["name"] == "code")
    assert code["stop"].startswith("its token budget stops it after ~4 of its 80 items, in ~")
    # Time and dollars come from the prior too: never unknown before the first answer.
    assert all(d["done_in_s"]["mean"] > 0 and d["cost_usd"]["mean"] > 0 for d in p["datasets"])
    assert p["job"]["time_s"]["p10"] < p["job"]["time_s"]["mean"] < p["job"]["time_s"]["p90"]


LANES = two_lanes(long_max_tokens=4096)


def test_plan_without_answers_uses_each_lanes_max_tokens(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"question {i}" + " word" * (i % 50)}]}
        for i in range(40)
    ]
    write_rows(tmp_path / "mixed.jsonl", rows)
    lanes = LANES.replace("concurrency = 4\n", "concurrency = 4\nmin_prompt_tokens = 30\n")
    lanes = lanes.replace(
        'escalate_to = "long"\n', 'escalate_to = "long"\nmax_prompt_tokens = 29\n'
    )
    with sim_in_thread(SimConfig(seed=7, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path, sim.base_url, datasets=[("chat", "mixed.jsonl", "openai")], extra=lanes
        )
        plan = run_cli("plan", str(job), "--json")
    assert plan.returncode == 0, plan.stderr
    flows = {f["lane"]: f for f in json.loads(plan.stdout)["flows"]}
    short, long_ = flows["short"], flows["long"]
    assert short["pending"] > 0 and long_["pending"] > 0
    # Each lane's own max_tokens: a long-lane item is expected 16x a short-lane one.
    assert long_["completion_tokens"] / long_["passages"] == pytest.approx(4096 / 4, rel=0.01)
    assert short["completion_tokens"] / short["passages"] == pytest.approx(256 / 4, rel=0.01)
    # Some short answers are expected to be truncated and sent on to the long lane.
    assert 0 < short["escalations"]["mean"] < short["passages"]
    assert long_["passages"] == pytest.approx(long_["pending"] + short["escalations"]["mean"])


def test_pilot_measures_escalations_and_the_job_cap_says_when_it_stops(tmp_path: Path) -> None:
    write_rows(tmp_path / "a.jsonl", chat_rows(120, "Alpha"))
    write_rows(tmp_path / "b.jsonl", chat_rows(120, "Beta"))
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")],
            extra="[budget]\nmax_cost_usd = 0.12\n" + LANES,
        )
        plan = run_cli("plan", str(job), "--pilot", "30", "--pilot-share", "1", "--json")
        assert plan.returncode == 0, plan.stderr
        pilot = query(tmp_path / "out", "SELECT COUNT(*) FROM ledger WHERE kind = 'escalated'")
        run = run_cli("run", str(job))
    p = json.loads(plan.stdout)
    flows = {(f["lane"], f["dataset"]): f for f in p["flows"]}
    assert pilot[0][0] > 0, "the pilot saw no truncated answer: the test needs some"
    # The short lane's escalation share, measured, sends passages on to the long lane.
    for ds in ("a", "b"):
        short, long_ = flows["short", ds], flows["long", ds]
        assert short["basis"] == "30 answers" or short["basis"].endswith("of lane short")
        assert long_["passages"] == pytest.approx(long_["pending"] + short["escalations"]["mean"])
        assert short["escalations"]["p10"] < short["escalations"]["mean"]
        assert short["escalations"]["mean"] < short["escalations"]["p90"]
    # The long lane rests on the few truncated answers the pilot sent on: the plan says so.
    assert any(a.startswith("lane long, dataset a: rests on") for a in p["job"]["assumptions"])
    # Attempts include retries and escalations: at least one per passage.
    assert all(f["attempts"] >= f["passages"] - 1e-9 for f in p["flows"])
    # The cap stops the job: the plan says so, and when; datasets after it are cut.
    assert p["job"]["stop"].startswith("the job's dollar cap: stops the job after ~")
    # It spends the room left, less about one request's worst case: the last one admitted
    # is the last whose worst case fits.
    cost = p["job"]["cost_usd"]
    assert cost["p90"] == pytest.approx(0.12 - p["spent_usd"])
    assert 0 < cost["mean"] < cost["p90"]
    assert any("stops it after" in (d["stop"] or "") for d in p["datasets"])
    assert run.returncode == 4, run.stderr  # the run then stops at the cap, as planned


def test_a_provider_that_refuses_requests_slows_the_planned_lane(tmp_path: Path) -> None:
    """A lane of 64 against a provider that answers 6 at once: the plan after a pilot expects
    far fewer on the wire than 64, and says why."""
    write_rows(tmp_path / "chat.jsonl", chat_rows(200))
    with sim_in_thread(refusing_sim(6, seed=2)) as sim:
        job = write_job(tmp_path, sim.base_url, concurrency=64, extra="initial_limit = 64\n")
        plan = run_cli("plan", str(job), "--pilot", "40", "--json")
    assert plan.returncode == 0, plan.stderr
    (lane,) = json.loads(plan.stdout)["lanes"]
    # The most answered at once is read off the client's own times on the wire, which a
    # loaded machine stretches (15 for this provider of 6 beside a test suite's run): far
    # fewer than 64, not an exact count.
    assert lane["on_wire"] is not None and lane["on_wire"] < 32, lane
    assert "refused for capacity" in lane["on_wire_basis"]


def test_the_regression_estimator_corrects_a_sample_that_drew_short_prompts() -> None:
    from regen.engine.eta import Stat

    rng = random.Random(3)
    # Answers grow with prompts; the sample drew mostly short prompts (mean 100), the items to
    # come average 300.
    xs = [rng.uniform(50, 150) for _ in range(30)] + [rng.uniform(250, 350) for _ in range(4)]
    ys = [2.0 * x + rng.gauss(0, 20) for x in xs]
    plain = Stat.of(ys)
    adjusted = Stat.regressed(ys, xs, 300.0)
    assert plain.mean < 350 and adjusted.mean == pytest.approx(600, rel=0.1)
    assert adjusted.se < plain.se
    # No relation: the adjustment is small, and never trusted beyond its clamp.
    flat = [rng.gauss(100, 10) for _ in xs]
    assert Stat.regressed(flat, xs, 300.0).mean == pytest.approx(100, rel=0.15)
    assert Stat.regressed(ys, xs, 1e6).mean == plain.mean
    assert not math.isnan(Stat.regressed(ys, [1.0] * len(ys), 5.0).mean)


# The plan's intervals, from constructed answers (no simulator): each models a spread the
# bench (bench/plan.py) found missing.


def offline_job(tmp: Path, lanes: str = "") -> Job:
    write_rows(tmp / "a.jsonl", chat_rows(10, "Alpha"))
    write_rows(tmp / "b.jsonl", chat_rows(10, "Beta"))
    path = write_job(
        tmp,
        "http://127.0.0.1:9/api/v1",
        datasets=[("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")],
        extra=lanes,
    )
    return load_job(path)


def progress(name: str, items: int) -> DatasetProgress:
    return DatasetProgress(name, 0, items, 0, items, items, 0, 0, 0, 0, 0.0)


def passage(lane: str, ds: str, outcome: str, seconds: float, usd: float) -> FlowEntry:
    return FlowEntry(lane, ds, outcome, 100, 1, 1, seconds, seconds, 100, 200, usd)


PRICES = Prices(0.000001, 0.000002)


def test_a_pilots_escalation_share_carries_its_binomial_spread_to_the_long_lane(
    tmp_path: Path,
) -> None:
    job = offline_job(tmp_path, LANES)
    # 30 short-lane passages per dataset, 9 truncated; the long lane's answers all alike.
    entries = [
        passage("short", ds, "escalated" if i < 9 else "done", 1.0, 0.001)
        for ds in ("a", "b")
        for i in range(30)
    ] + [passage("long", ds, "done", 4.0, 0.01) for ds in ("a", "b") for _ in range(9)]
    pending = {("short", "a"): (1000, 100_000), ("short", "b"): (1000, 100_000)}
    p = plan(job, [progress("a", 1000), progress("b", 1000)], entries, {}, pending, PRICES, {})
    flows = {(f.lane, f.dataset): f for f in p.flows}
    esc = flows["short", "a"].escalations
    # 9 of 30: the share is unsure by about 0.08 either way, the count by about a quarter.
    assert esc.mean == pytest.approx(300)
    assert esc.p90 / esc.mean > 1.25 and esc.p10 / esc.mean < 0.8
    # The long lane's dollars and time grow with that count: at least as unsure as it is.
    long_a = flows["long", "a"]
    assert long_a.cost_usd is not None
    assert long_a.cost_usd.p90 / long_a.cost_usd.mean > 1.25
    assert long_a.time_s.p90 / long_a.time_s.mean > 1.25
    (long_lane,) = [lane for lane in p.lanes if lane.name == "long"]
    assert long_lane.escalations_in.p10 < long_lane.escalations_in.mean == pytest.approx(600)
    # None truncated in 30 does not mean none will be.
    none = [passage("short", "a", "done", 1.0, 0.001) for _ in range(30)]
    p0 = plan(job, [progress("a", 1000)], none, {}, {("short", "a"): (1000, 100_000)}, PRICES, {})
    (short0,) = [f for f in p0.flows if f.lane == "short" and f.dataset == "a"]
    assert short0.escalations.mean == 0 and short0.escalations.p90 == 0
    assert short0.escalations == Interval(0.0, 0.0, 0.0)


def test_the_prior_without_answers_claims_no_more_than_a_guess_can(tmp_path: Path) -> None:
    job = offline_job(tmp_path)
    pending = {("default", "a"): (1000, 100_000), ("default", "b"): (1000, 100_000)}
    completions_only = Prices(0.0, 0.000002)
    p = plan(job, [progress("a", 1000), progress("b", 1000)], [], {}, pending, completions_only, {})
    a = next(d for d in p.datasets if d.name == "a")
    assert a.cost_usd is not None and a.cost_usd.prior and a.done_in_s is not None
    # Completions of max_tokens/4 are a guess: from max_tokens/16 to all of it (p10-p90);
    # the time also as the speed may be half or twice the guess.
    assert a.cost_usd.p10 == pytest.approx(a.cost_usd.mean / 4, rel=0.15)
    assert a.cost_usd.p90 == pytest.approx(a.cost_usd.mean * 4, rel=0.15)
    assert a.done_in_s.p10 < a.done_in_s.mean / 4 and a.done_in_s.p90 > a.done_in_s.mean * 5
    # Answers cut at max_tokens go nowhere without a longer lane: no escalations.
    assert a.escalations == Interval(0.0, 0.0, 0.0)
    # The same guess for every dataset: their errors add up, the job is as unsure as each.
    assert p.cost_usd is not None
    assert p.cost_usd.p90 / p.cost_usd.mean == pytest.approx(a.cost_usd.p90 / a.cost_usd.mean)


def test_a_pilot_with_a_precision_sends_each_dataset_what_its_spread_needs(
    tmp_path: Path,
) -> None:
    """`--pilot 300 --precision 0.1`: 30 items per dataset, then more while the job's cost or
    time over the items to come is not known within +/-10%, shared as their spreads say: a
    dataset of mixed answer lengths gets more than one of steady ones, and the total the pilot
    then predicts holds within what it said."""
    rng = random.Random(4)
    filler = ["apples", "rivers", "graphs", "engines", "proteins", "markets"]

    def row(i: int, long: bool) -> dict[str, object]:
        text = (
            f"Task {i}: prove, derive, explain step by step and implement: "
            + " ".join(rng.choices(filler, k=300))
            if long
            else f"Question {i}: what is {rng.choice(filler)}?"
        )
        return {"messages": [{"role": "user", "content": text}]}

    write_rows(tmp_path / "steady.jsonl", [row(i, False) for i in range(400)])
    write_rows(tmp_path / "mixed.jsonl", [row(i, rng.random() < 0.3) for i in range(400)])
    per_item = (
        "SELECT i.dataset, COUNT(DISTINCT i.id), SUM(l.cost_usd) / COUNT(DISTINCT i.id), "
        "(SELECT COUNT(*) FROM items j WHERE j.dataset = i.dataset AND j.status = 'pending') "
        "FROM items i JOIN ledger l ON l.item_id = i.id WHERE i.status != 'pending' "
        "GROUP BY i.dataset"
    )
    with sim_in_thread(SimConfig(seed=3, time_scale=0.01)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("steady", "steady.jsonl", "openai"), ("mixed", "mixed.jsonl", "openai")],
            concurrency=32,
        )
        # A pilot's default money bound (5% of the expected cost) would end it after a round:
        # this test is about how it shares its items, so it may spend half.
        plan = run_cli(
            "plan",
            str(job),
            "--pilot",
            "300",
            "--precision",
            "0.1",
            "--pilot-share",
            "0.5",
            "--json",
        )
        assert plan.returncode == 0, plan.stderr
        pilot = {ds: (n, usd, left) for ds, n, usd, left in query(tmp_path / "out", per_item)}
        spent_before = sum(c for _, c in spent(tmp_path / "out").values())
        run = run_cli("run", str(job))
        assert run.returncode == 0, run.stderr
    run_cost = sum(c for _, c in spent(tmp_path / "out").values()) - spent_before
    quantities = {q["name"]: q for q in json.loads(plan.stdout)["pilot"]}
    assert set(quantities) == {"time", "cost"}
    assert all(0 < q["error"] <= 0.1 for q in quantities.values()), quantities
    assert pilot["mixed"][0] > pilot["steady"][0] >= 30, pilot
    assert "pilot round 1: steady 30, mixed 30 items; time +/-" in plan.stderr
    assert "; next: " in plan.stderr and "pilot round 2" in plan.stderr
    # The job's cost over the items then to come, as the pilot's means predict it, holds.
    predicted = sum(usd * left for _, usd, left in pilot.values())
    assert abs(predicted / run_cost - 1) <= 2 * quantities["cost"]["error"], (predicted, run_cost)


def test_precision_needs_a_pilot(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9/v1")
    for args in (("--precision", "0.1"), ("--pilot", "30", "--precision", "1.5")):
        out = run_cli("plan", str(job), *args)
        assert out.returncode == 2 and "--precision" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_pilot_shares_its_items_as_the_datasets_spreads_say() -> None:
    """Neyman allocation: for one total over two datasets with as many items to come, the one
    whose items vary three times as much gets three times the items; sending them brings the
    total's error within what was asked."""
    from regen.run.pilot import Quantity, next_sizes, quantity

    rng = random.Random(5)
    samples = {
        "a": [({"x": rng.gauss(10, 1)}, 0.0) for _ in range(30)],
        "b": [({"x": rng.gauss(10, 3)}, 0.0) for _ in range(30)],
    }
    q = quantity("time in lane x", samples, {"a": 5000, "b": 5000}, 0.01)
    assert q.error is not None and q.error > 0.01
    assert q.needs["b"] / q.needs["a"] == pytest.approx(3, rel=0.35)
    # With those sizes the error falls to about what was asked (MARGIN below it).
    bigger = {
        ds: [(w, 0.0) for w in [{"x": rng.gauss(10, sd)} for _ in range(q.needs[ds])]]
        for ds, sd in (("a", 1), ("b", 3))
    }
    assert quantity("time in lane x", bigger, {"a": 5000, "b": 5000}, 0.01).error < 0.0105
    # Sizes: what is asked, at least half as many again, never past --pilot N or the items.
    asked = Quantity("cost", 0.2, {"a": 100, "b": 31, "c": 500})
    sizes = next_sizes([asked], {"a": 30, "b": 30, "c": 30}, {"a": 1000, "b": 1000, "c": 40}, 400)
    assert sizes == {"a": 100, "b": 45, "c": 70}
    assert next_sizes([asked], {"a": 400}, {"a": 10}, 400) == {}
    assert next_sizes([Quantity("cost", 0.05, {})], {"a": 30}, {"a": 10}, 400) == {}
    # A need worked out from a round's few answers grows a dataset at most 8x a round.
    far = Quantity("items the cap leaves", 0.8, {"a": 5000})
    assert next_sizes([far], {"a": 30}, {"a": 9000}, 9000) == {"a": 240}


def fake_store(
    finished: dict[str, int],
    values: dict[str, list[Any]],
    usd: float = 0.0,
    items: int = 2000,
    cut: dict[tuple[str, str], list[float]] | None = None,
) -> Any:
    """A store as the pilot reads it: `finished` items of `items` per dataset, their (time per
    lane, dollars) in `values`, `usd` spent per finished item; `cut`: per (lane, dataset) the
    times of answers cut off still running."""
    from types import SimpleNamespace

    return SimpleNamespace(
        work=SimpleNamespace(
            dataset_progress=lambda: [
                SimpleNamespace(
                    name=ds,
                    pending=items - n,
                    done=n,
                    failed=0,
                    cost_usd=n * usd,
                    prompt_tokens=0,
                    completion_tokens=n * 100,
                )
                for ds, n in finished.items()
            ]
        ),
        spend=SimpleNamespace(
            item_totals=lambda: values,
            answer_latencies=lambda lane: [
                t[lane] for rows in values.values() for t, _ in rows if lane in t
            ],
        ),
        outstanding=SimpleNamespace(cut_short=lambda: dict(cut or {})),
    )


def fake_job(cap: float | None = None, budget: int | None = None) -> Any:
    """A job of datasets a and b (`budget`: each one's token budget) on one lane."""
    from types import SimpleNamespace

    return SimpleNamespace(
        datasets=[SimpleNamespace(name=ds, token_budget=budget) for ds in ("a", "b")],
        lane_list=[SimpleNamespace(name="default")],
        budget=SimpleNamespace(max_cost_usd=cap, budget_tokens="completion"),
    )


def test_a_sized_pilot_stops_asking_a_dataset_that_finishes_nothing_more() -> None:
    """A dataset whose budget is met during the pilot finishes nothing more however many
    items it is asked for: it is not asked again (each round is a whole dispatch), and the
    last round says why the pilot stops short."""
    import io

    from rich.console import Console

    from regen.events import listening
    from regen.run.pilot import Limits, Sent, run_pilot
    from regen.view.events import TerminalListener

    rng = random.Random(2)
    finished = {"a": 0, "b": 0}
    values: dict[str, list[tuple[dict[str, float], float]]] = {"a": [], "b": []}
    rounds: list[dict[str, int]] = []

    def send(want: dict[str, int], limits: Limits) -> Sent:
        rounds.append(want)
        for ds, n in want.items():
            cap = n if ds == "a" else 30  # b's budget is met at 30 items
            while finished[ds] < min(cap, 2000):
                finished[ds] += 1
                values[ds].append(({"default": rng.lognormvariate(0, 1)}, rng.uniform(0, 2)))
        return Sent(None)

    store = fake_store(finished, values)
    job = fake_job()
    out = io.StringIO()
    with listening(TerminalListener(Console(file=out, width=300))):
        run_pilot(job, store, 1000, 0.05, send)  # type: ignore[arg-type]
    asked_b = [r["b"] for r in rounds]
    assert asked_b[0] == 30 and len(set(asked_b)) <= 2, rounds  # asked more once, then not
    assert finished["a"] > 100 and finished["b"] == 30
    assert "nothing more finished in b (a budget met?)" in out.getvalue(), out.getvalue()


def test_a_fixed_pilot_says_how_well_it_measured_and_how_to_size_it(tmp_path: Path) -> None:
    from regen.run.pilot import Quantity, pilot_lines

    rng = random.Random(6)
    rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": f"Task {i}: prove, derive, explain step by step and implement: "
                    + " ".join(rng.choices(["graphs", "rivers", "engines"], k=300))
                    if rng.random() < 0.2
                    else f"Question {i}: what is it?",
                }
            ]
        }
        for i in range(200)
    ]
    write_rows(tmp_path / "mixed.jsonl", rows)
    with sim_in_thread(SimConfig(seed=3, time_scale=0.01)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("mixed", "mixed.jsonl", "openai")])
        out = run_cli("plan", str(job), "--pilot", "30")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert re.search(r"pilot measured: time \+/-\d+%, cost \+/-\d+%", text), text
    assert "--precision 0.1` sends more items where they narrow it" in text
    # Sized, or narrow enough: no note.
    narrow = [Quantity("time", 0.08, {}), Quantity("cost", 0.12, {})]
    assert pilot_lines(narrow, None) == ["pilot measured: time +/-8%, cost +/-12%"]
    wide = [Quantity("time in lane long", 0.21, {}), Quantity("cost", None, {})]
    assert len(pilot_lines(wide, None)) == 2 and len(pilot_lines(wide, 0.1)) == 1
    assert pilot_lines([Quantity("cost", None, {})], None) == []


def two_datasets(tmp: Path, rows: int = 300) -> list[tuple[str, str, str]]:
    """Datasets a and b of `rows` chat rows each."""
    for name in ("a", "b"):
        write_rows(tmp / f"{name}.jsonl", chat_rows(rows))
    return [("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")]


def test_a_precision_pilot_ends_within_its_time_bound(tmp_path: Path) -> None:
    """Answers that never come (held by the simulator) would keep a pilot waiting for its
    round for ever: `--pilot-time 4` stops sending at 3.6 s and gives those in flight 0.4 s,
    so the pilot's runs take 4 s at most, and its last line says what it could not measure."""
    with sim_in_thread(SimConfig(seed=5, time_scale=0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=two_datasets(tmp_path), concurrency=8)
        sim.simulator.hold(after=10)  # round 1 asks 20 (half of 5% of 600, 10 at least)
        try:
            out = run_cli(
                "plan",
                str(job),
                "--pilot",
                "300",
                "--precision",
                "0.05",
                "--pilot-time",
                "4",
                process=True,
                timeout=60,
            )
        finally:
            sim.simulator.release()
    assert out.returncode == 0, out.stderr
    runs = query(tmp_path / "out", "SELECT kind, ended_at - started_at FROM runs")
    assert runs and all(kind == "pilot" for kind, _ in runs), runs
    # The bound ends sending and waiting; the run's end is recorded after its last commit,
    # which on a loaded machine takes a few milliseconds more (4.003 s was seen): a second
    # for that bookkeeping, against answers that would otherwise hang for the test's 60 s.
    assert sum(took for _, took in runs) <= 4.0 + 1.0, runs
    assert "pilot bounds: 4.0s" in out.stdout or "pilot bounds: 4s" in out.stdout, out.stdout
    assert "pilot: not pinned down to +/-5%:" in out.stdout, out.stdout
    assert "it stopped at its time bound (" in out.stdout, out.stdout
    assert "note: the pilot's time ran out with answers still running" in out.stdout


def bounded_pilot(tmp: Path, *flags: str) -> tuple[dict[str, tuple[int, float]], list[str]]:
    """`regen plan --pilot 300 --precision 0.01 FLAGS` on datasets a, b and c (c with a token
    budget of 200,000): what each dataset used, and the pilot's closing lines."""
    write_rows(tmp / "c.jsonl", chat_rows(300))
    with sim_in_thread(SimConfig(seed=6, time_scale=0)) as sim:
        job = write_job(
            tmp,
            sim.base_url,
            datasets=two_datasets(tmp),
            extra='[[datasets]]\nname = "c"\npath = "c.jsonl"\nformat = "openai"\n'
            "token_budget = 200000\n",
            concurrency=4,
        )
        out = run_cli("plan", str(job), "--pilot", "300", "--precision", "0.01", *flags, "--json")
    assert out.returncode == 0, out.stderr
    return spent(tmp / "out"), json.loads(out.stdout)["pilot_notes"]


def test_a_precision_pilot_ends_within_its_money_bound(tmp_path: Path) -> None:
    """`--pilot-usd 0.002` is enforced as a dollar cap is (worst cases reserved): the pilot
    spends no more, and says that bound ended it; no dataset is said to have met its token
    share when the money stopped it first."""
    per_ds, notes = bounded_pilot(tmp_path, "--pilot-usd", "0.002")
    assert sum(usd for _, usd in per_ds.values()) <= 0.002, per_ds
    assert any("its money bound ($0.0020" in n for n in notes), notes
    assert not any("share of its token budget" in n for n in notes), notes


def test_a_precision_pilot_uses_a_share_of_a_token_budget(tmp_path: Path) -> None:
    """A dataset's token budget is used up to --pilot-share of it, and beyond by no more than
    the requests in flight may write (4 of max_tokens 512: a token budget's own bound), and
    the plan names the dataset; the others go on."""
    per_ds, notes = bounded_pilot(tmp_path, "--pilot-usd", "5", "--pilot-share", "0.05")
    share = 0.05 * 200_000
    assert share - 512 <= per_ds["c"][0] <= share + 4 * 512, per_ds
    assert per_ds["a"][0] > per_ds["c"][0], per_ds
    assert any(n.startswith("pilot: c stopped at its share of its token budget") for n in notes)


def test_an_uncapped_pilot_spends_a_share_of_the_expected_cost() -> None:
    """Without a dollar cap the pilot's money is 5% of the job's expected cost, known once the
    first round has measured it: a first round of 30 items per dataset of 2,000 already spends
    1.5% of it, so the second round may spend the rest of the 5% and no more (its limit), and
    the pilot then ends saying so, not after more rounds."""
    import io

    from rich.console import Console

    from regen.events import listening
    from regen.run.pilot import Limits, Sent, run_pilot
    from regen.view.events import TerminalListener

    rng = random.Random(3)
    finished = {"a": 0, "b": 0}
    values: dict[str, list[Any]] = {"a": [], "b": []}
    limits_seen: list[Limits] = []

    def send(want: dict[str, int], limits: Limits) -> Sent:
        limits_seen.append(limits)
        for ds, n in want.items():
            while finished[ds] < n:
                if limits.total_usd is not None and sum(finished.values()) + 1 > limits.total_usd:
                    return Sent("dollar cap met", cap=True)
                finished[ds] += 1
                values[ds].append(({"default": rng.lognormvariate(0, 1)}, 1.0))
        return Sent(None)

    out = io.StringIO()
    store = fake_store(finished, values, usd=1.0)
    with listening(TerminalListener(Console(file=out))):
        result = run_pilot(fake_job(), store, 1000, 0.01, send)  # type: ignore[arg-type]
    assert limits_seen[0].total_usd is None  # nothing measured yet
    # Expected cost: $1 per item, 4,000 items: the pilot may spend $200.
    assert limits_seen[1].total_usd == pytest.approx(200.0)
    assert sum(finished.values()) <= 200
    assert len(limits_seen) == 2, limits_seen
    assert (
        "pilot bounds: 10m, 5% of the expected cost (after the first round, which sends at "
        "most 30 items per dataset, about half that share of each)" in out.getvalue()
    )
    assert any("it stopped at its money bound ($200.0000" in n for n in result.notes), result.notes


def test_an_uncapped_pilots_first_round_spends_about_half_its_share() -> None:
    """Without a cap the money bound is known only once a first round has measured the cost:
    on a job of 2 x 400 items that round sends half the share of each dataset's items (10,
    not 30), a random sample that costs about half the bound; the later rounds are bounded."""
    import io

    from rich.console import Console

    from regen.events import listening
    from regen.run.pilot import Limits, Sent, run_pilot
    from regen.view.events import TerminalListener

    finished = {"a": 0, "b": 0}
    values: dict[str, list[Any]] = {"a": [], "b": []}
    rounds: list[dict[str, int]] = []

    def send(want: dict[str, int], limits: Limits) -> Sent:
        rounds.append(dict(want))
        for ds, n in want.items():
            while finished[ds] < n:
                if limits.total_usd is not None and sum(finished.values()) + 1 > limits.total_usd:
                    return Sent("dollar cap met", cap=True)
                finished[ds] += 1
                values[ds].append(({"default": 1.0 + finished[ds] % 7}, 1.0))
        return Sent(None)

    out = io.StringIO()
    store = fake_store(finished, values, usd=1.0, items=400)
    with listening(TerminalListener(Console(file=out))):
        run_pilot(fake_job(), store, 200, 0.01, send)  # type: ignore[arg-type]
    assert rounds[0] == {"a": 10, "b": 10}
    # $1 an item, 800 items: the bound is $40, and the first round spent $20 of it.
    assert sum(finished.values()) <= 40
    assert "which sends at most 10 items per dataset" in out.getvalue()


def test_the_verdict_allows_for_a_kill_and_names_what_the_cap_leaves_unsent(
    tmp_path: Path,
) -> None:
    """The plan promises every item within the cap only when the cap also covers the kill
    margin (each lane full of requests at their worst case, billed after a kill -9); it states
    the margin and the re-pay of truncated first tries; and where the cap binds it names the
    datasets it stops and the items left unsent."""
    entries = [
        passage("short", ds, "escalated" if i < 9 else "done", 1.0, 0.001)
        for ds in ("a", "b")
        for i in range(30)
    ] + [passage("long", ds, "done", 4.0, 0.01) for ds in ("a", "b") for _ in range(9)]
    pending = {("short", "a"): (1000, 100_000), ("short", "b"): (1000, 100_000)}
    ps = [progress("a", 1000), progress("b", 1000)]

    def verdict(cap: float | None) -> Any:
        budget = "" if cap is None else f"\n[budget]\nmax_cost_usd = {cap}\n"
        sub = tmp_path / str(cap)
        sub.mkdir()
        return plan(offline_job(sub, LANES + budget), ps, entries, {}, pending, PRICES, {})

    free = verdict(None)
    assert free.cost_usd is not None and free.kill_margin_usd is not None
    expected, margin = free.cost_usd.mean, free.kill_margin_usd
    # Each lane full (its concurrency) at max_tokens and a prompt bound of 4 x 100 + 256.
    job = offline_job(tmp_path, LANES)
    assert margin == pytest.approx(
        sum(
            lane.concurrency * PRICES.cost(656, job.lane_max_tokens(lane)) for lane in job.lane_list
        )
    )
    # 600 truncated first tries at $0.001 each are paid before the long lane answers them.
    assert free.repay_usd == pytest.approx(0.6, rel=0.01)

    roomy = verdict(round(expected + margin + 1, 2))
    assert roomy.stop.startswith("every item is expected to finish within the job's dollar cap")
    assert roomy.unsent == 0
    tight = verdict(round(expected + margin / 2, 2))
    assert "only if no run is killed" in tight.stop, tight.stop
    assert f"${margin:.2f}" in tight.stop and tight.unsent == 0
    short = verdict(round(expected / 2, 2))
    assert short.stop.startswith("the job's dollar cap: stops the job"), short.stop
    assert 0 < short.unsent < 2000 and f"; {short.unsent} items stay unsent: " in short.stop
    unsent = {d.name: d.pending - d.sent for d in short.datasets}
    assert sum(unsent.values()) == short.unsent
    for name, n in unsent.items():
        if n:
            assert f"{name} ({n})" in short.stop, short.stop


def test_the_items_a_cap_leaves_ask_the_pilot_for_the_datasets_that_decide_them() -> None:
    """The count a cap leaves unsent is a quantity like a total, with each dataset weighted by
    how far its dollars move the count: the dataset after the cut is asked for nothing, and
    one whose dollars move the count more is asked for more; a count known well enough asks
    nothing; a count of a few items is measured against a floor share of the items to come."""
    from regen.engine.eta import Z90
    from regen.run.pilot import UNSENT_FLOOR, CapLeaves, unsent_quantity

    leaves = CapLeaves(100.0, {"a": 10.0, "b": 30.0, "c": 0.0})
    done = {"a": 30, "b": 30, "c": 30}
    to_come = {"a": 1000, "b": 1000, "c": 1000}
    q = unsent_quantity(leaves, done, to_come, 0.1)
    assert q.error == pytest.approx(Z90 * (10**2 + 30**2) ** 0.5 / 100)
    assert "c" not in q.needs and q.needs["b"] > 2 * q.needs["a"] > 30
    # With those items, the count would be within the precision asked.
    after = {ds: leaves.sd[ds] * (done[ds] / q.needs[ds]) ** 0.5 for ds in ("a", "b")}
    assert Z90 * (after["a"] ** 2 + after["b"] ** 2) ** 0.5 / 100 <= 0.1
    assert unsent_quantity(CapLeaves(100.0, {"a": 1.0}), done, to_come, 0.1).needs == {}
    few = unsent_quantity(CapLeaves(3.0, {"a": 2.0}), done, to_come, 0.1)
    assert few.error == pytest.approx(Z90 * 2.0 / (UNSENT_FLOOR * 3000))


def test_a_pilot_under_a_cap_measures_the_items_it_leaves() -> None:
    """A job of a then b under a cap that runs out in b: a pilot sized to +/-10% measures the
    count the cap leaves too (`leaves`: the ending played from the pilot's answers), sends
    more than it would for the totals alone, and ends with that count within what it asked."""
    from regen.engine.eta import Stat
    from regen.run.ending import Flow, Lane, play
    from regen.run.pilot import CapLeaves, Limits, Sent, run_pilot

    def pilot(with_cap: bool) -> tuple[dict[str, int], list[Any]]:
        rng = random.Random(5)
        finished = {"a": 0, "b": 0}
        values: dict[str, list[tuple[dict[str, float], float]]] = {"a": [], "b": []}

        def send(want: dict[str, int], limits: Limits) -> Sent:
            for ds, n in want.items():
                while finished[ds] < min(n, 2000):
                    finished[ds] += 1
                    usd = rng.uniform(0.5, 1.5) if ds == "a" else rng.lognormvariate(0, 0.8)
                    values[ds].append(({"default": usd}, usd))
            return Sent(None)

        def leaves() -> CapLeaves | None:
            flows = {}
            for ds in ("a", "b"):
                s = Stat.of([usd for _, usd in values[ds]])
                flows["one", ds] = Flow(1.0, s.mean, 0.0, 1.0, cost_se=s.se)
            lane = Lane("one", [(ds, 2000 - finished[ds]) for ds in ("a", "b")])
            # The cap: a's items and 70% of b's at their true means; the pilot spends from it.
            cap = 2000 * 1.0 + 0.7 * 2000 * math.exp(0.32)
            spent = sum(usd for ds in ("a", "b") for _, usd in values[ds])
            ending = play([lane], flows, cap - spent)
            return (
                None if ending is None else CapLeaves(sum(ending.unsent.values()), ending.unsent_sd)
            )

        out = run_pilot(
            fake_job(),
            fake_store(finished, values),
            2000,
            0.1,
            send,
            leaves=leaves if with_cap else None,
        )
        return dict(finished), out.quantities

    sizes, quantities = pilot(True)
    plain, _ = pilot(False)
    (q,) = [q for q in quantities if q.name == "items the cap leaves"]
    assert q.error is not None and q.error <= 0.1, quantities
    assert sizes["a"] + sizes["b"] > plain["a"] + plain["b"], (sizes, plain)


def test_a_pilot_says_when_its_money_bound_fits_fewer_requests_than_the_lanes_keep(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Admission holds each request's worst case against the pilot's money bound: a bound of
    $0.05 with worst cases of $0.012 lets 4 go at once, of the 32 the lanes keep on the wire.
    The pilot says so, with how to give it more; a bound that fits them all says nothing."""
    import logging

    from regen.run.pilot import Bounds, Limits, Sent, run_pilot

    def send(want: dict[str, int], limits: Limits) -> Sent:
        return Sent(None)

    store = fake_store({"a": 0, "b": 0}, {"a": [], "b": []})
    with caplog.at_level(logging.INFO, logger="regen"):
        run_pilot(fake_job(), store, 30, None, send, Bounds(usd=0.05, worst_usd=0.012, at_once=32))
    assert "fits 4 requests at once at their worst case ($0.0120 each" in caplog.text
    assert "of the 32 the lanes keep on the wire" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="regen"):
        run_pilot(fake_job(), store, 30, None, send, Bounds(usd=1.0, worst_usd=0.012, at_once=32))
    assert "fits" not in caplog.text
