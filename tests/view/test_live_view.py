"""The live view on a terminal fits its width: every figure of the job at 120 columns, more
detail at 200, and at 80 a planned core (progress.DEGRADE_ORDER), never a value cut in two."""

from __future__ import annotations

import io
import re
import time
from collections import Counter

import pytest
from rich.cells import cell_len
from rich.console import Console

from regen.engine.eta import Eta, eta_text, spend_reaches
from regen.engine.limiter import AdaptiveLimit, EndpointHealth
from regen.engine.runtime import Outage
from regen.engine.stats import (
    DatasetStats,
    EndpointStats,
    JobTotals,
    LaneStats,
    RunStats,
    last_stretch,
)
from regen.state.work import DatasetProgress
from regen.view.progress import (
    DEGRADE_ORDER,
    LIVE_COLUMNS,
    ProgressView,
    progress_line,
    progress_view,
    summary_table,
)

NOW = 10_000.0
STARTED = NOW - 1_500.0


def _lane(concurrency: int, limit: int, in_flight: int, datasets: dict[str, int]) -> LaneStats:
    lane = LaneStats(concurrency=concurrency, in_flight=in_flight, datasets=list(datasets))
    lane.limits.append(AdaptiveLimit(concurrency, limit, clock=lambda: NOW))
    lane.wire.change(NOW - 30.0, in_flight)
    for k, (name, remaining) in enumerate(datasets.items()):
        flow = lane.flow(name)
        flow.remaining = remaining
        for i in range(200):
            flow.add_latency(4.0 + (i * 7 + k) % 13)
        flow.answers = flow.finished = 200
    return lane


def busy_stats() -> RunStats:
    """A run 25 minutes in: three datasets with long names over two lanes, errors of three
    classes, a token budget, a dollar cap with spend from an earlier run, and credit."""
    glaive = DatasetStats(
        items=40_000,
        done_before=10_000,
        token_budget=30_000_000,
        before=JobTotals(done=10_000, cost_usd=4.5),
        done=12_345,
        failed=17,
        in_flight=48,
        completion_tokens=9_876_543,
        cost_usd=7.2345,
        errors=Counter({"rate_limited": 11, "timeout": 4}),
    )
    magpie = DatasetStats(
        items=25_000,
        done=8_000,
        failed=3,
        in_flight=30,
        completion_tokens=4_200_000,
        cost_usd=3.1,
        errors=Counter({"server": 3}),
    )
    hermes = DatasetStats(items=9_000, done=0, in_flight=16)
    stats = RunStats(
        datasets={
            "function_calling_glaive": glaive,
            "magpie_reasoning_ultra": magpie,
            "hermes_agent_traces_v2": hermes,
        },
        started_at=STARTED,
        credits_usd=123.45,
        max_cost_usd=40.0,
    )
    stats.lanes = {
        "fast": _lane(64, 48, 78, {"function_calling_glaive": 17_655, "magpie_reasoning_ultra": 0}),
        "big": _lane(32, 20, 16, {"hermes_agent_traces_v2": 9_000}),
    }
    stats.lanes["big"].escalated = 5
    stats.lanes["fast"].done = 20_345
    # Samples a minute ago, for the rolling rates.
    stats.samples.append(
        (
            NOW - 60.0,
            {
                "function_calling_glaive": (11_745, 9_400_000),
                "magpie_reasoning_ultra": (7_700, 4_050_000),
                "hermes_agent_traces_v2": (0, 0),
            },
        )
    )
    return stats


def job_eta_text() -> str:
    _, eta = busy_stats().etas(NOW)
    assert eta is not None and eta.p10 < eta.seconds < eta.p90
    return eta_text(eta)


def render(view: ProgressView, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(view)
    return console.export_text()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 160, 200])
def test_no_line_is_wider_than_the_terminal(width: int) -> None:
    text = render(progress_view(busy_stats(), NOW), width)
    assert max(cell_len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", [80, 120, 200])
def test_no_value_is_cut(width: int) -> None:
    text = render(progress_view(busy_stats(), NOW), width)
    assert "…" not in text
    for name in busy_stats().datasets:
        assert name in text


@pytest.mark.parametrize("width", [120, 200])
def test_every_figure_of_the_job_shows_at_120_columns_and_up(width: int) -> None:
    text = render(progress_view(busy_stats(), NOW), width)
    for value in (
        "done 30345/74000",
        "failed 20",
        "in flight 94",
        "15.0 req/s",  # (30345 - 29445) answers in the last 60 s
        "10.4k tok/s",
        "spent $10.3345 (job $14.8345)",  # this run, and with the earlier run's $4.50
        "left $25.1655 of $40 cap",
        "credit left $123.45",
        f"ETA {job_eta_text()}",
        "errors 18: rate_limited 11, timeout 4, server 3",
        "lane fast  limit 48/64  78 in flight",
        "lane big  limit 20/32  16 in flight  5 escalated",
    ):
        assert value in text, (value, text)
    assert re.search(r"ETA \S+ \(\S+-\S+\)", text), text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    for name, done in (
        ("function_calling_glaive", "22345/40000"),
        ("magpie_reasoning_ultra", "8000/25000"),
        ("hermes_agent_traces_v2", "0/9000"),
        ("total", "30345/74000"),
    ):
        assert done in rows[name], rows


def test_a_wide_terminal_shows_the_detail() -> None:
    text = render(progress_view(busy_stats(), NOW), 200)
    for column in LIVE_COLUMNS:
        assert column in text, column
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    glaive = rows["function_calling_glaive"]
    for value in ("9.88M/30.00M", "800", "0.73", "rate_limited:11,timeout:4", "7.2345"):
        assert value in glaive, (value, glaive)
    assert "rate_limited:11,server:3,timeout:4" in rows["total"]
    assert "mean 78 on wire" in text and "20345 done" in text


def test_120_columns_give_up_the_detail_first_in_the_planned_order() -> None:
    text = render(progress_view(busy_stats(), NOW), 120)
    header = next(line for line in text.splitlines() if "dataset" in line)
    kept = [c for c in LIVE_COLUMNS if c in header.split("│")[0] or f" {c} " in header]
    given_up = [c for c in LIVE_COLUMNS if c not in kept]
    assert given_up == ["tokens/budget", "mean len", "$/Mtok"]
    assert set(given_up) == set(DEGRADE_ORDER[:3])
    # errors by class became a count per dataset; the header keeps the breakdown
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "rate_limited:" not in rows["function_calling_glaive"]
    assert re.search(r"│ 15 +│", rows["function_calling_glaive"]), rows


def test_80_columns_keep_the_planned_core() -> None:
    text = render(progress_view(busy_stats(), NOW), 80)
    for value in (
        "done 30345/74000",
        f"ETA {job_eta_text()}",
        "spent $10.3345",
        "errors 18",
        "limit 48/64",
        "limit 20/32",
    ):
        assert value in text, (value, text)
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "22345/40000" in rows["function_calling_glaive"]
    assert "done/total" in text and "ETA (p10-p90)" in text


def test_many_error_classes_shorten_to_the_commonest_then_the_total() -> None:
    stats = busy_stats()
    stats.datasets["hermes_agent_traces_v2"].errors.update(
        {"connection": 2, "overloaded": 9, "invalid_response": 1, "truncated": 6}
    )
    view = progress_view(stats, NOW)
    wide = render(view, 200)
    assert (
        "errors 36: rate_limited 11, overloaded 9, truncated 6, timeout 4, server 3, "
        "connection 2, invalid_response 1" in wide
    )
    narrow = render(view, 64)
    assert "errors 36: rate_limited 11, overloaded 9, truncated 6, +4 more" in narrow
    assert "errors 36\n" in render(view, 20)


def test_the_same_view_lays_out_again_for_a_resized_terminal() -> None:
    view = progress_view(busy_stats(), NOW)
    assert "mean len" in render(view, 200)
    assert "mean len" not in render(view, 120)


def test_without_cap_or_credit_the_view_says_neither() -> None:
    stats = busy_stats()
    stats.max_cost_usd = None
    stats.credits_usd = None
    stats.stop_reason = "interrupted (Ctrl-C)"
    text = render(progress_view(stats, NOW), 120)
    assert "cap" not in text and "credit" not in text
    assert "stopping: interrupted (Ctrl-C)" in text
    assert "cost_left_usd" not in progress_line(stats, NOW)


def test_the_progress_line_adds_what_is_left_of_the_cap() -> None:
    line = progress_line(busy_stats(), NOW)
    fields = dict(kv.split("=", 1) for kv in line.split()[2:])
    assert fields["cost_left_usd"] == "25.1655"
    assert fields["cost_usd"] == "10.3345"
    assert fields["credits_usd"] == "123.4500"


def test_held_bills_show_as_what_they_are_and_stand_in_for_the_eta_when_they_block() -> None:
    """A rerun waiting for a killed run's bills showed `in_flight=0 req_s=0.00 eta_s=4293`
    and nothing of the hold."""
    from regen.engine.holds import HoldSummary

    stats = busy_stats()
    held = HoldSummary(36, 0.0712, 36, 0.0712, 1_800_000_000.0)
    stats.holds = lambda: held
    text = render(progress_view(stats, NOW), 200)
    assert "waiting for the bills of 36 requests of an earlier run: up to $0.0712" in text
    fields = dict(kv.split("=", 1) for kv in progress_line(stats, NOW).split()[2:])
    assert (fields["held"], fields["held_usd"]) == ("36", "0.0712")
    for d in stats.datasets.values():
        d.in_flight = 0
    blocked = render(progress_view(stats, NOW), 120)
    assert "ETA: held for bills until" in blocked


@pytest.mark.parametrize("width", [80, 120, 200])
def test_items_waiting_for_budget_room_show_as_what_they_wait_for(width: int) -> None:
    """Workers waiting for a budget's room, held by requests in flight, were neither in
    flight nor shown: a capped run looked idle."""
    stats = busy_stats()
    lanes = list(stats.lanes.values())
    lanes[0].waiting["job dollar cap held by requests in flight"] = 12
    lanes[-1].waiting["job dollar cap held by requests in flight"] += 3
    lanes[-1].waiting["glaive-function-calling: token budget held by requests in flight"] = 2
    text = render(progress_view(stats, NOW), width)
    flat = " ".join(text.split())
    assert "waiting for budget room: 15 on job dollar cap held by requests in flight" in flat
    assert "2 on glaive-function-calling: token budget held by requests in flight" in flat
    assert "ETA" in text  # the ETA stands: the wait ends as requests settle
    fields = dict(kv.split("=", 1) for kv in progress_line(stats, NOW).split()[2:])
    assert fields["budget_wait"] == "17"
    for lane in lanes:
        lane.waiting.clear()
    assert "budget_wait" not in progress_line(stats, NOW)
    assert "budget room" not in render(progress_view(stats, NOW), width)


def summary_datasets() -> tuple[list[DatasetProgress], dict[tuple[str, str], int]]:
    long = "B1-glaive-function-calling"
    ds = [
        DatasetProgress(long, 0, 20000, 12, 30, 19800, 19790, 3, 1_234_567, 9_876_543, 12.3456),
        DatasetProgress("code", 1, 5000, 0, 0, 5000, 5000, 0, 234_567, 876_543, 2.3456),
    ]
    errors = {(long, "rate_limited"): 120, (long, "server"): 3, ("code", "timeout"): 2}
    return ds, errors


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_end_summary_fits_the_console_and_keeps_what_the_run_did(width: int) -> None:
    """It used to squeeze every column to `12…` at 80 columns and cut at 120."""
    ds, errors = summary_datasets()
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(summary_table(ds, errors, {"B1-glaive-function-calling": 19790, "code": 5000}))
    text = console.export_text()
    assert max(cell_len(line) for line in text.splitlines()) <= width
    assert "…" not in text  # no value cut
    for kept in ("items", "done", "failed", "cost $", "exported", "B1-glaive-function-calling"):
        assert kept in text
    assert "19790" in text and "12.3456" in text
    if width == 200:  # all of it, errors by class too
        assert "rate_limited:120,server:3" in text and "$/Mtok" in text


def test_the_last_frame_says_when_the_run_ended_not_an_eta() -> None:
    """The final live frame kept the ETA of its last second."""
    live = render(progress_view(busy_stats(), NOW), 120)
    assert "ETA " in live
    last = render(progress_view(busy_stats(), NOW, ended=True), 120)
    head, _, table = last.partition("ETA (p10-p90)")
    assert "ETA" not in head and "ended after" in head
    rows = [line for line in table.splitlines() if "│" in line]
    assert rows and all(line.rstrip().endswith("-") for line in rows)


def pool_stats() -> RunStats:
    """busy_stats with a pool of three servers: gpu1 out of the pool since 60 s ago (its
    requests went to the others), gpu2 cooling down after failures in a row."""
    stats = busy_stats()
    for i, answers in enumerate((9_000, 2_345, 1_000)):
        ep = stats.endpoints[f"gpu{i}"] = EndpointStats(
            health=EndpointHealth(clock=lambda: NOW),
            limits=[AdaptiveLimit(64, 30, clock=lambda: NOW)],
        )
        ep.answers, ep.latency_sum_s, ep.on_wire = answers, answers * 6.0, 10 * i
        ep.errors = Counter({"connection": 3 * i})
    stats.endpoints["gpu1"].health.drain()
    stats.endpoints["gpu1"].outages = [Outage(time.time() - 60, resent=3)]
    stats.endpoints["gpu2"].health.cool_until = NOW + 12
    return stats


@pytest.mark.parametrize("width", [80, 120, 200])
def test_each_endpoint_of_a_pool_has_its_line(width: int) -> None:
    text = render(progress_view(pool_stats(), NOW), width)
    assert max(cell_len(line) for line in text.splitlines()) <= width
    lines = {m[1]: m[0] for m in re.finditer(r"endpoint (gpu\d)\b.*", text)}
    assert set(lines) == {"gpu0", "gpu1", "gpu2"}, text
    assert "OUT of the pool since" in lines["gpu1"] and "up" in lines["gpu0"].split()
    assert "cooling down 12s" in lines["gpu2"]
    if width >= 200:  # every figure on one line
        assert "9000 answered  0 failed  mean 6.0s" in lines["gpu0"]
        assert "2345 answered  3 failed  mean 6.0s  1 outage, 3 re-sent" in lines["gpu1"]


def test_a_pool_with_every_server_out_says_so_in_place_of_the_eta() -> None:
    stats = pool_stats()
    for ep in stats.endpoints.values():
        ep.health.drain()
        ep.outages = ep.outages or [Outage(time.time() - 5)]
    text = render(progress_view(stats, NOW), 120)
    assert "ETA: every server out of the pool since" in text
    assert f"ETA {job_eta_text()}" not in text
    # The log line (and `regen status`, which reads it) says so too.
    line = progress_line(stats, NOW)
    assert "endpoints_out=3/3" in line and re.search(r"pool_down_since=\d+", line)
    assert "pool_down_since" not in progress_line(pool_stats(), NOW)
    assert "endpoints_out=1/3" in progress_line(pool_stats(), NOW)


def test_the_first_seconds_show_a_labelled_range_not_a_point() -> None:
    """A run's first seconds (issue 37: `eta_s=12733` for a two-minute job): only a pilot's
    answers, nothing or 2 of 32 requests on the wire. The ETA counts the lane at its limit,
    shows as a range marked `prior`, and run.log's line says so."""
    for sent in (0, 32):
        lane = LaneStats(concurrency=32, datasets=["chat"])
        lane.limits.append(AdaptiveLimit(32, 32, clock=lambda: NOW))
        if sent:
            for k in range(sent):
                lane.wire.change(NOW - 0.9 + 0.01 * k, +1)
            lane.wire.full(NOW - 0.6)
            lane.wire.change(NOW - 0.2, -30)
        flow = lane.flow("chat")
        flow.remaining = 3000
        for i in range(30):
            flow.add_latency(1.0 + i % 3)  # the pilot's: 2 s on average
        stats = RunStats(datasets={"chat": DatasetStats(items=3000)}, started_at=NOW - 1)
        stats.lanes = {"default": lane}
        text = render(progress_view(stats, NOW), 120)
        assert re.search(r"ETA ~\S+-\S+ \(prior\)", text), text
        fields = dict(kv.split("=", 1) for kv in progress_line(stats, NOW).split() if "=" in kv)
        assert fields["eta_basis"] == "prior"
        assert 3000 * 2.0 / 32 < float(fields["eta_s"]) < 3000 * 2.0 / 32 * 1.5


def test_regen_status_says_how_many_items_wait_for_budget_room() -> None:
    from regen.view.status import Snapshot, snapshot_view

    line = {"at": "12:00:00", "in_flight": "40", "req_s": "3.1", "out_tok_s": "900"}
    line |= {"eta_s": "120", "eta_p10_s": "90", "eta_p90_s": "160", "budget_wait": "12"}
    running = Snapshot("out", 4242, [], {}, [], [], [], line)
    out = io.StringIO()
    Console(file=out, width=200).print(snapshot_view(running))
    assert "ETA 2m (2m-3m) as of that line; 12 items waiting for budget room" in " ".join(
        out.getvalue().split()
    )
    ended = Snapshot("out", None, [], {}, [], [], [], line)
    out = io.StringIO()
    Console(file=out, width=200).print(snapshot_view(ended))
    assert "budget room" not in out.getvalue()  # a line of a run that has ended says nothing now


def test_a_dataset_with_nothing_left_shows_no_time_left_not_its_lanes() -> None:
    # magpie has nothing left in its lane, after glaive's 17,655 items: it was shown the time
    # glaive still needs (issue 47: a complete dataset got an ETA, and the job took the largest).
    stats = busy_stats()
    etas, job = stats.etas(NOW)
    magpie, glaive = etas["magpie_reasoning_ultra"], etas["function_calling_glaive"]
    assert magpie is not None and magpie.seconds == 0.0 and eta_text(magpie) == "0s"
    assert glaive is not None and glaive.seconds > 0
    assert job is not None and job.seconds >= glaive.seconds


def test_the_token_column_counts_the_jobs_spend_against_the_budget() -> None:
    # A rerun after earlier runs spent 29.5M of glaive's 30M budget: its column showed this
    # run's tokens alone against the whole job's budget (issue 47: `0/500.0k` for a spent one).
    stats = busy_stats()
    stats.datasets["function_calling_glaive"].completion_tokens = 0
    stats.tokens_spent = lambda name: 29_500_000
    text = render(progress_view(stats, NOW), 200)
    assert "29.50M/30.00M" in text and " 0/30.00M" not in text


def test_the_jobs_dollar_cap_binds_when_the_lanes_spending_side_by_side_reaches_it() -> None:
    # Answers cost $0.001 each: the fast lane has $17.66 of work over its 2,253 s, the big
    # lane $9.00 over 5,611 s. The cap is one room for every dataset, and the lanes spend it
    # side by side: $13.35 is gone at about 1,415 s (7.8 + 1.6 mills a second), both lanes
    # still running. Cutting every lane's items to the same share (half) said 2,800 s: a
    # fast lane spends its part long before a slow one (bench/realistic.py: +30%).
    def etas(room: float | None) -> tuple[float, dict[str, float]]:
        stats = busy_stats()
        for lane in stats.lanes.values():
            for flow in lane.flows.values():
                flow.cost_usd = flow.finished * 0.001
        stats.budget_left = lambda name: (None, room)
        stats.job_usd_left = lambda: room
        _, eta = stats.etas(NOW)
        assert eta is not None
        lanes = {k: e.seconds for k, e in stats.lane_etas.items() if e is not None}
        return eta.seconds, lanes

    free, free_lanes = etas(None)
    assert free_lanes["fast"] < 0.5 * free_lanes["big"] and free == free_lanes["big"]
    capped, _ = etas(13.35)
    assert 1300 < capped < 1550
    # $22: the fast lane ends first, having spent all its $17.66 (and the big lane $3.6);
    # the big lane alone then spends the last $0.74 in about 460 s more.
    capped, lanes = etas(22.0)
    assert lanes["fast"] == free_lanes["fast"]
    assert free_lanes["fast"] + 350 < capped == lanes["big"] < free_lanes["fast"] + 600


def test_a_lane_fed_by_escalations_spends_what_waits_in_the_order_it_came_under_the_cap() -> None:
    # The short lane is done; the long lane has 1,000 cheap escalated items ($0.001) and then
    # 1,000 dear ones ($0.01, long each_turn prompts) waiting. It takes escalated items first
    # in, first out, and the short lane sent them on in the job's order: the cheap ones go
    # first, and $5.50 of room lasts 72.5% of the lane's time (1,000 cheap, then 450 dear).
    def job_eta(room: float | None) -> float:
        short = _lane(64, 64, 0, {"cheap": 0, "dear": 0})
        return _fed_lane_eta(short, {"cheap": 1000, "dear": 1000}, 2000, room)

    free = job_eta(None)
    assert 0.68 * free < job_eta(5.5) < 0.77 * free


def _fed_lane_eta(
    short: LaneStats, waiting: dict[str, int], items: int, room: float | None
) -> float:
    """The job's ETA with a short lane escalating to a long one (16 on the wire) in which
    `waiting` items of each dataset wait, their answers costing $0.001 (cheap) or $0.01
    (dear), under the job's dollar cap's `room` (None: no cap)."""
    stats = RunStats(
        datasets={name: DatasetStats(items=items) for name in waiting}, started_at=STARTED
    )
    stats.lanes = {"short": short, "long": _lane(16, 16, 16, waiting)}
    short.escalate_to = "long"
    for name, each in (("cheap", 0.001), ("dear", 0.01)):
        flow = stats.lanes["long"].flow(name)
        flow.cost_usd = flow.finished * each
    stats.budget_left = lambda name: (None, None)  # the job's cap only
    stats.job_usd_left = lambda: room
    _, eta = stats.etas(NOW)
    assert eta is not None
    return eta.seconds


def test_a_fed_lane_spends_each_datasets_escalations_from_when_they_come() -> None:
    # The short lane has 2,000 items of each dataset left, half of each to be escalated; the
    # long lane has nothing waiting yet, and its answers cost $0.001 (cheap) or $0.01 (dear:
    # long agent turns). It takes what is waiting, so the dataset its feeder sends on last is
    # spent last: with the dear one last, $5.50 of the $11 lasts well past half the lane's
    # time; with it first, the lane spends on it alone at full pace and the room is gone
    # before half. Spread evenly over the lane's time, both said half (bench/realistic.py:
    # every miss short, where the agent turns came last).
    def cap_share(order: list[str], room: float | None) -> float:
        short = _lane(64, 64, 64, dict.fromkeys(order, 2000))
        for flow in short.flows.values():
            flow.answered, flow.escalated = 200, 100
        return _fed_lane_eta(short, dict.fromkeys(order, 0), 4000, room)

    free = cap_share(["cheap", "dear"], None)
    assert free == cap_share(["dear", "cheap"], None)
    assert cap_share(["cheap", "dear"], 5.5) > 0.65 * free
    assert cap_share(["dear", "cheap"], 5.5) < 0.5 * free


def test_a_budget_the_sending_lane_meets_leaves_no_escalations_to_come() -> None:
    # The short lane has 2,000 items of each dataset left, half of each escalated; "math" has
    # tokens left for 500 of its short answers (100 tokens each), which the short lane uses
    # while the long lane works its backlog: by the time math's escalations come up there, its
    # budget is met and they stay pending. The long lane's work is chat's 1,000, not math's
    # 1,000 too (bench/realistic.py: a math dataset met on the short lane, its escalations
    # counted as long answers ahead of the agent turns, the ETA +30%).
    def job_eta(math_tokens_left: float | None, reached: bool = True) -> float:
        short = _lane(64, 64, 64, {"chat": 2000, "math": 2000})
        short.escalate_to = "long"
        for flow in short.flows.values():
            flow.answered, flow.escalated = 200, 100
            flow.tokens = 200 * 100
        if not reached:  # math's answers are a pilot's: none of this run's yet
            math = short.flow("math")
            math.finished = math.tokens = 0
            math.earlier_tokens = 200 * 100
        stats = RunStats(
            datasets={name: DatasetStats(items=4000) for name in ("chat", "math")},
            started_at=STARTED,
        )
        stats.lanes = {"short": short, "long": _lane(16, 16, 16, {"chat": 0, "math": 0})}
        for flow in stats.lanes["long"].flows.values():
            flow.tokens = 200 * 1000
        stats.budget_left = lambda name: (
            (math_tokens_left, None) if name == "math" else (None, None)
        )
        _, eta = stats.etas(NOW)
        assert eta is not None
        return eta.seconds

    free = job_eta(None)  # 2,000 escalations
    assert job_eta(50_000) == pytest.approx(free / 2, rel=0.05)
    # Before the run reaches math, its pilot's answers say what an item uses.
    assert job_eta(50_000, reached=False) == pytest.approx(free / 2, rel=0.05)
    # With room for the short lane's 2,000 and then some, math's long answers get the rest.
    assert job_eta(200_000 + 500 * 1000) == pytest.approx(free * 1500 / 2000, rel=0.05)


def test_the_caps_share_prices_each_flow_at_its_own_earlier_answers() -> None:
    # A pilot answered every flow; this run has reached only one dataset, whose answers are
    # cheap. Priced at the lane's mean of this run, the work left looked cheaper than it is
    # and the ETA counted items the cap will never send (bench/realistic.py: the long
    # each_turn prompts of datasets not reached yet cost several times the lane's mean).
    def job_eta(earlier_usd_each: float) -> float:
        stats = busy_stats()
        for lane in stats.lanes.values():
            for flow in lane.flows.values():
                flow.cost_usd = flow.finished * 0.001
                flow.answered = flow.finished + 20  # the pilot's 20 answers
                flow.earlier_cost_usd = 20 * earlier_usd_each
        stats.budget_left = lambda name: (None, 13.35)
        stats.job_usd_left = lambda: 13.35
        _, eta = stats.etas(NOW)
        assert eta is not None
        return eta.seconds

    assert job_eta(0.01) < 0.8 * job_eta(0.001)


def _one_lane_under_a_cap(room: float | None, prompts_to_come: int, worst_each: float = 0.0) -> Eta:
    """The lane's ETA for 2,000 items of one dataset on 16 slots (a mean of 10 s an answer),
    under `room` dollars of the job's cap (None: no cap): the pilot's 20 answers had prompts
    of 20k-29.5k tokens and cost $0.6 a million of them plus a cent; the items to come
    average `prompts_to_come`. `worst_each`: what the cap holds for each request on the wire
    (0: not known)."""
    stats = RunStats(datasets={"swe": DatasetStats(items=2000)}, started_at=STARTED)
    lane = _lane(16, 16, 16, {"swe": 2000})
    flow = lane.flow("swe")
    flow.prompts_left = 2000.0 * prompts_to_come
    for i in range(20):
        prompt = 20_000 + 500 * i
        flow.add_priced(prompt, 0.6e-6 * prompt + 0.01)
    flow.cost_usd = sum(usd for _, usd in flow.priced)
    flow.answered = 20
    lane.worst_usd.extend([worst_each] * 16 if worst_each else [])
    stats.lanes = {"default": lane}
    stats.budget_left = lambda name: (None, None)
    stats.job_usd_left = lambda: room
    stats.etas(NOW)
    eta = stats.lane_etas["default"]
    assert eta is not None
    return eta


def test_the_caps_share_prices_the_items_to_come_at_their_own_prompts() -> None:
    # An agent turn's bill is mostly its prompt: the pilot drew prompts longer than the rest
    # average, and the ETA priced every item left at the pilot's mean, so the cap seemed to
    # bind sooner than it did (bench/realistic.py seed 3: -26% to -40%).
    free = _one_lane_under_a_cap(None, 24_750).seconds
    for prompt in (24_750, 10_000):
        each = 0.6e-6 * prompt + 0.01
        pace = 2000 * each / free  # dollars a second, every item at the same pace
        eta = _one_lane_under_a_cap(5.0, prompt)
        assert eta.seconds == pytest.approx(5.0 / pace + eta.drain, rel=1e-3)


def test_the_caps_last_stretch_goes_at_half_the_pace() -> None:
    # Near the cap, admission lets a request go only while its worst case fits what those on
    # the wire leave: below 16 worst cases of room ($0.64 here) the requests on the wire fall
    # off to none, and that stretch takes about twice what it would at the full pace, their
    # drain in it (bench/realistic.py: 16 to 0 over 30-40 s, where the ETA said 13-25 s).
    free = _one_lane_under_a_cap(None, 24_750).seconds
    each = 0.6e-6 * 24_750 + 0.01
    pace = 2000 * each / free
    stretched = _one_lane_under_a_cap(5.0, 24_750, worst_each=0.04)
    assert stretched.seconds == pytest.approx((5.0 - 0.64) / pace + 2 * 0.64 / pace, rel=1e-3)


def test_the_caps_last_stretch_is_paced_by_the_work_its_dollars_pay_for() -> None:
    # The lane's cheap dataset (a cent a second for 100 s) then a dear one (a dime a second):
    # the room runs out 0.5 s into the dear one, and the last $0.10 of it spans both. Taken
    # at the cheap pace alone the stretch came to 20 s, the end at 115 s, past the dear
    # dataset's own; at the pace of the work it pays for it is 5.5 s at full pace, 11 s at
    # half (bench/realistic.py seed 8 at 50%: 154 s shown, 119 s left).
    pieces = [(0.0, 100.0, 1.0), (100.0, 110.0, 1.0)]
    full, end = spend_reaches(pieces, 0.95), spend_reaches(pieces, 1.05)
    assert full == pytest.approx(95.0) and end == pytest.approx(100.5)
    assert last_stretch(pieces, 1.05, 0.10, end) == pytest.approx(95.0 + 2 * 5.5)
    # Within one dataset it is the half pace the stretch has always been.
    half = spend_reaches(pieces, 0.5)
    assert half == pytest.approx(50.0)
    assert last_stretch(pieces, 0.5, 0.10, half) == pytest.approx(40.0 + 2 * 10.0)
    assert last_stretch(pieces, 0.5, 0.0, half) is None
