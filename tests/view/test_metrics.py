"""What Prometheus scrapes: job totals that agree with `regen status` across a resume, this
run's counters beside them, names that follow Prometheus's naming rules, and a Grafana
dashboard that uses only names the collector emits."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from regen.engine.client import RETRYABLE, STOPS_RUN
from regen.engine.holds import HoldSummary
from regen.engine.limiter import AdaptiveLimit
from regen.engine.runtime import Outage
from regen.engine.stats import DatasetStats, EndpointStats, JobTotals, LaneStats, RunStats
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from regen.view.metrics import exposition
from tests.conftest import (
    SECRET_KEY,
    chat_rows,
    free_port,
    query,
    run_cli,
    start_cli,
    write_job,
    write_rows,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
Families = dict[str, Any]  # family name (counters without `_total`) -> Metric


def families(text: str) -> Families:
    return {f.name: f for f in text_string_to_metric_families(text)}


def scrape(port: int, timeout_s: float = 60) -> str:
    """`/metrics` as text, once the endpoint listens (polled with a deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                return str(r.read().decode())
        except OSError:
            assert time.monotonic() < deadline, f"no /metrics on port {port}"
            time.sleep(0.05)


def samples(fams: Families, family: str, name: str | None = None, **labels: str) -> list[Sample]:
    return [
        s
        for s in fams[family].samples
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(fams: Families, family: str, name: str | None = None, **labels: str) -> float:
    found = samples(fams, family, name, **labels)
    assert len(found) == 1, (family, labels, found)
    return float(found[0].value)


def stop(proc: subprocess.Popen[str], release: Any) -> tuple[str, str]:
    """SIGTERM a run, let its held requests be answered, and wait for it to exit."""
    try:
        proc.send_signal(signal.SIGTERM)
        release()
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# Naming rules (https://prometheus.io/docs/practices/naming/), checked on what is served.

NAME = re.compile(r"regen_[a-z][a-z0-9]*(_[a-z0-9]+)*")
NOT_BASE_UNITS = {"ms", "millis", "milliseconds", "minutes", "hours", "days", "cents", "percent"}
UNIT_WORDS = (  # a quantity the HELP text names -> the unit the name must carry
    (re.compile(r"\bseconds\b", re.I), "seconds"),
    (re.compile(r"\b(dollars|usd)\b", re.I), "usd"),
    (re.compile(r"\btokens\b", re.I), "tokens"),
)
RESERVED = ("_total", "_count", "_sum", "_bucket", "_created")


def naming_problems(text: str) -> list[str]:
    """Every way the served metrics break Prometheus's naming rules (empty: none)."""
    problems = []
    for f in text_string_to_metric_families(text):
        name, parts = f.name, f.name.split("_")
        names = {s.name for s in f.samples}
        if not NAME.fullmatch(name):
            problems.append(f"{name}: not snake_case under regen_")
        if not f.documentation:
            problems.append(f"{name}: no HELP")
        if bad := NOT_BASE_UNITS & set(parts):
            problems.append(f"{name}: not a base unit: {sorted(bad)}")
        if f.type == "counter":
            # The parser strips a counter's `_total`: one left over means `_total_total`.
            if name.endswith("_total") or not names <= {f"{name}_total", f"{name}_created"}:
                problems.append(f"{name}: counter samples {sorted(names)} not NAME_total")
        elif f.type == "histogram":
            allowed = {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            if not names <= allowed:
                problems.append(f"{name}: histogram samples {sorted(names)}")
        else:
            if name.endswith(RESERVED) or any(n.endswith("_total") for n in names):
                problems.append(f"{name}: a {f.type} with a counter's or histogram's suffix")
        for words, unit in UNIT_WORDS:
            if words.search(f.documentation) and unit not in parts:
                problems.append(f"{name}: its HELP counts {unit} but the name does not say so")
        if ("seconds" in parts or "time" in parts) and parts[-1] != "seconds":
            problems.append(f"{name}: the unit `seconds` goes last")
        if "usd" in parts and parts[-1] != "usd":
            problems.append(f"{name}: the unit `usd` goes last (before a counter's _total)")
        if name.endswith("_info") and any(s.value != 1 for s in f.samples):
            problems.append(f"{name}: an info metric's value is 1")
    return problems


def fake_stats() -> RunStats:
    """A resumed run's stats in which every metric has something to say."""
    before = JobTotals(40, 2, 1000, 5000, 0.25, {"http_5xx": 3})
    d = DatasetStats(items=100, done_before=40, before=before, done=10, failed=1, in_flight=4)
    d.prompt_tokens, d.completion_tokens, d.cost_usd = 100, 500, 0.025
    d.errors = Counter({"http_5xx": 1, "timeout": 2})
    lane = LaneStats(8, [AdaptiveLimit(8, 4)], datasets=["chat"])
    lane.waiting["job dollar cap held by requests in flight"] = 3
    lane.in_flight = 4
    flow = lane.flow("chat")
    flow.remaining = 47
    for _ in range(20):
        flow.add_latency(1.5)
        lane.observe_latency(1.5)
    stats = RunStats(datasets={"chat": d}, lanes={"default": lane})
    stats.credits_usd, stats.max_cost_usd = 12.5, 5.0
    ep = stats.endpoints["upstream"] = EndpointStats(limits=lane.limits)
    ep.answers, ep.completion_tokens, ep.on_wire = 10, 500, 4
    ep.errors = Counter({"connection": 7})
    ep.outages = [Outage(1e9, 1e9 + 30, resent=7)]
    stats.holds = lambda: HoldSummary(36, 0.07, 36, 0.07, 1e9)
    return stats


def test_job_totals_are_before_the_run_plus_this_run_and_run_counters_stand_apart() -> None:
    fams = families(exposition(fake_stats()))
    # The job's answers are done items only (a resume may take failed ones back): failed
    # items are a state, in regen_items, and this run's are in regen_run_answers.
    assert value(fams, "regen_answers") == 50
    assert {tuple(s.labels) for s in fams["regen_answers"].samples} == {("dataset",)}
    assert value(fams, "regen_run_answers", outcome="done") == 10
    assert value(fams, "regen_run_answers", outcome="failed") == 1
    assert value(fams, "regen_tokens", kind="prompt") == 1100
    assert value(fams, "regen_tokens", kind="completion") == 5500
    assert value(fams, "regen_run_tokens", kind="completion") == 500
    assert abs(value(fams, "regen_cost_usd") - 0.275) < 1e-12
    assert abs(value(fams, "regen_run_cost_usd") - 0.025) < 1e-12
    assert value(fams, "regen_attempt_errors", **{"class": "http_5xx"}) == 4
    assert value(fams, "regen_attempt_errors", **{"class": "timeout"}) == 2
    assert value(fams, "regen_run_attempt_errors", **{"class": "http_5xx"}) == 1
    # An outage is one event, however many requests it failed; they count where they went.
    assert value(fams, "regen_run_endpoint_outages", endpoint="upstream") == 1
    assert value(fams, "regen_run_endpoint_resent", endpoint="upstream") == 7
    assert value(fams, "regen_run_endpoint_attempt_errors", **{"class": "connection"}) == 7
    assert value(fams, "regen_endpoint_up", endpoint="upstream") == 1
    assert value(fams, "regen_endpoint_requests_in_flight", endpoint="upstream") == 4
    assert value(fams, "regen_run_endpoint_tokens", kind="completion") == 500
    # Items by state add up to the dataset's items, as in `regen status`.
    states = {s.labels["state"]: s.value for s in fams["regen_items"].samples}
    assert states == {"done": 50, "failed": 3, "pending": 47}
    assert value(fams, "regen_items_in_flight") == 4
    assert value(fams, "regen_requests_in_flight") == 4
    assert value(fams, "regen_concurrency_limit") == 4
    assert value(fams, "regen_concurrency_configured") == 8
    held = "job dollar cap held by requests in flight"
    assert value(fams, "regen_items_waiting_for_budget", lane="default", held=held) == 3
    assert value(fams, "regen_cost_cap_usd") == 5.0
    assert value(fams, "regen_held_requests") == 36 and value(fams, "regen_held_usd") == 0.07
    assert value(fams, "regen_credit_remaining_usd") == 12.5
    p10, p50, p90 = (value(fams, "regen_eta_seconds", quantile=q) for q in ("0.1", "0.5", "0.9"))
    assert 0 < p10 <= p50 <= p90
    assert value(fams, "regen_build_info", version=__import__("regen").__version__) == 1
    assert abs(value(fams, "regen_run_start_time_seconds") - time.time()) < 3600


def test_every_metric_name_follows_the_prometheus_naming_rules() -> None:
    text = exposition(fake_stats())
    assert naming_problems(text) == []
    assert "_total_total" not in text
    # The checker itself catches what it is for.
    bad = (
        "# HELP regen_spent Dollars spent\n# TYPE regen_spent gauge\nregen_spent 1\n"
        "# HELP regen_wait_ms Seconds waited\n# TYPE regen_wait_ms gauge\nregen_wait_ms 1\n"
        "# HELP regen_done_total x\n# TYPE regen_done_total gauge\nregen_done_total 1\n"
        "# HELP regen_x_total_total x\n# TYPE regen_x_total counter\nregen_x_total_total 1\n"
    )
    assert len(naming_problems(bad)) >= 4


def test_the_dashboard_uses_only_metrics_the_collector_emits() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 39
    assert [(i["name"], i["pluginId"]) for i in dash["__inputs"]] == [
        ("DS_PROMETHEUS", "prometheus")
    ]
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    exprs = [v["query"]["query"] for v in dash["templating"]["list"]]
    for panel in dash["panels"]:
        assert panel["datasource"] == ds, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ds, panel["title"]
            exprs.append(target["expr"])
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    labels: dict[str, set[str]] = {}  # emitted sample name -> its label names
    for f in families(exposition(fake_stats())).values():
        for s in f.samples:
            labels.setdefault(s.name, set()).update(s.labels)
    used = {m for e in exprs for m in re.findall(r"\bregen_[a-z0-9_]+", e)}
    assert used - set(labels) == set()
    # ... and only labels those metrics have, in selectors and in `by (...)`.
    for e in exprs:
        for name, selector in re.findall(r"\b(regen_[a-z0-9_]+)\{([^}]*)\}", e):
            keys = set(re.findall(r"([a-z_]+)\s*[=!]~?", selector))
            assert keys <= labels[name], (e, keys - labels[name])
        grouped = {k.strip() for by in re.findall(r"\bby \(([^)]*)\)", e) for k in by.split(",")}
        for name in re.findall(r"\bregen_[a-z0-9_]+", e):
            assert grouped <= labels[name], (e, grouped - labels[name])
    for name in (
        "regen_answers_total",
        "regen_requests_in_flight",
        "regen_concurrency_limit",
        "regen_cost_usd_total",
        "regen_cost_cap_usd",
        "regen_eta_seconds",
        "regen_attempt_errors_total",
        "regen_tokens_total",
        "regen_request_latency_seconds_bucket",
    ):
        assert name in used, name
    # rate() only of what only goes up: counters and a histogram's series.
    for e in exprs:
        for name in re.findall(r"rate\((regen_[a-z0-9_]+)", e):
            assert name.endswith(("_total", "_bucket", "_sum", "_count")), e


def counters(fams: Families, *, run: bool) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the job's counters (`regen_*_total`), or of this run's
    (`regen_run_*_total`), by series."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for f in fams.values()
        if f.type == "counter" and f.name.startswith("regen_run_") == run
        for s in f.samples
        if s.name.endswith("_total")
    }


def dropped(earlier: Families, later: Families, *, run: bool) -> dict[Any, Any]:
    """The counters of `earlier` that `later` has lower (or not at all)."""
    before, after = counters(earlier, run=run), counters(later, run=run)
    return {k: (v, after.get(k)) for k, v in before.items() if after.get(k, -1.0) < v}


def test_job_totals_after_a_resume_agree_with_regen_status(tmp_path: Path) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(300))
    first_port, port = free_port(), free_port()
    # One attempt per item: a failed attempt ends its item at once, so state.db has every
    # attempt that the run counted as soon as it commits.
    faults = SimFaults(http_5xx=0.1, http_5xx_codes=[502])
    with sim_in_thread(SimConfig(seed=7, time_scale=0.0, faults=faults)) as sim:
        simulator = sim.simulator
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("chat", "chat.jsonl", "openai")],
            concurrency=8,
            extra="initial_limit = 8\nmax_attempts = 1",
        )

        def status() -> dict[str, Any]:
            res = run_cli("status", str(tmp_path / "out"), "--json")
            assert res.returncode == 0, res.stderr
            (chat,) = json.loads(res.stdout)["datasets"]
            return dict(chat)

        # The first run: 40 requests answered, then scraped once state.db has what it counted
        # (commits come in ticks), and stopped while 8 are held.
        simulator.hold(after=40)
        first = start_cli("run", str(job), "--metrics-port", str(first_port))
        try:
            assert simulator.wait_until(lambda: simulator.held == 8, 60)
            deadline = time.monotonic() + 60
            while True:
                first_fams = families(scrape(first_port))
                then = status()
                counted = (
                    value(first_fams, "regen_run_answers", outcome="done"),
                    value(first_fams, "regen_run_answers", outcome="failed"),
                )
                if (then["done"], then["failed"]) == counted:
                    break
                assert time.monotonic() < deadline, (then, counted)
                time.sleep(0.05)
        finally:
            _, err = stop(first, simulator.release)
        assert first.returncode == 5, err
        earlier = status()
        assert earlier["done"] >= 30 and earlier["pending"] > 100
        # A resume gives transient failures another chance: those items are pending again, and
        # the job's failed count (in status and in regen_items, a gauge) drops to the ones kept.
        classes = ",".join(f"'{c}'" for c in RETRYABLE | STOPS_RUN)
        ((kept,),) = query(
            tmp_path / "out",
            "SELECT COUNT(*) FROM items WHERE status = 'failed'"
            f" AND failure_class NOT IN ({classes})",
        )
        assert earlier["failed"] > kept  # some will be tried again
        first_failed = value(first_fams, "regen_items", state="failed")
        assert first_failed > kept  # ... some the first run's scrape counted

        # The resumed run, scraped while 8 of its requests are held and nothing else moves.
        simulator.hold(after=40)
        second = start_cli("run", str(job), "--metrics-port", str(port))
        try:
            fams = families(scrape(port))
            assert simulator.wait_until(lambda: simulator.held == 8, 60)
            deadline = time.monotonic() + 60
            while True:  # until state.db has what this run counted (commits come in ticks)
                last, fams = fams, families(scrape(port))
                # In a run, every counter only goes up, this run's and the job's; and no job
                # counter is below what the first run's scrape said.
                assert dropped(last, fams, run=True) == dropped(last, fams, run=False) == {}
                assert dropped(first_fams, last, run=False) == {}
                now = status()
                gained = (now["done"] - earlier["done"], now["failed"] - kept)
                counted = (
                    value(fams, "regen_run_answers", outcome="done"),
                    value(fams, "regen_run_answers", outcome="failed"),
                )
                if gained == counted:
                    break
                assert time.monotonic() < deadline, (gained, counted)
                time.sleep(0.05)
            text = scrape(port)
            fams, now = families(text), status()
        finally:
            out, err = stop(second, simulator.release)
    assert second.returncode == 5, err
    assert f"metrics: http://127.0.0.1:{port}/metrics" in out
    assert naming_problems(text) == []
    assert SECRET_KEY not in text

    # The job totals are what `regen status` says, not this run's share of them.
    assert value(fams, "regen_run_answers", outcome="done") >= 30
    assert value(fams, "regen_answers") == now["done"] > earlier["done"]
    assert now["failed"] > 0  # the faults were there
    for state in ("done", "failed", "pending"):
        assert value(fams, "regen_items", state=state) == now[state], state
    assert value(fams, "regen_tokens", kind="prompt") == now["prompt_tokens"]
    assert value(fams, "regen_tokens", kind="completion") == now["completion_tokens"]
    assert abs(value(fams, "regen_cost_usd") - now["cost_usd"]) < 1e-9
    assert now["cost_usd"] > earlier["cost_usd"] > 0
    errors = {s.labels["class"]: s.value for s in fams["regen_attempt_errors"].samples}
    assert errors == now["errors"]
    # Beside them, this run's own counters: the job's totals less the first run's.
    assert value(fams, "regen_run_tokens", kind="prompt") == (
        now["prompt_tokens"] - earlier["prompt_tokens"]
    )
    run_cost = value(fams, "regen_run_cost_usd")
    assert abs(run_cost - (now["cost_usd"] - earlier["cost_usd"])) < 1e-9
    assert value(fams, "regen_requests_in_flight", lane="default") == 8
    assert value(fams, "regen_items_in_flight") == 8

    # Every job counter only went up across the resume, though the job's failed items went
    # down (the retried ones left the gauge, which starts the second run at the kept ones).
    assert (
        value(fams, "regen_items", state="failed")
        - value(fams, "regen_run_answers", outcome="failed")
        == kept
        < first_failed
    )
    assert {name for name, _ in counters(first_fams, run=False)} >= {
        "regen_answers_total",
        "regen_tokens_total",
        "regen_cost_usd_total",
        "regen_attempt_errors_total",
    }
    assert dropped(first_fams, fams, run=False) == {}


def test_metrics_endpoint_while_a_job_runs(tmp_path: Path) -> None:
    write_rows(tmp_path / "chat.jsonl", chat_rows(300))
    port = free_port()
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("chat", "chat.jsonl", "openai")],
            concurrency=16,
            extra="initial_limit = 16",
        )
        sim.simulator.hold(after=20)  # 20 answers, then 16 in flight until the end
        proc = start_cli("run", str(job), "--metrics-port", str(port))
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held == 16, 60)
            deadline = time.monotonic() + 60
            while True:  # until the 20 answers are committed
                text = scrape(port)
                fams = families(text)
                if value(fams, "regen_items", state="done") >= 20:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            out, err = stop(proc, sim.simulator.release)
    assert proc.returncode == 5, err  # stopped with items left
    assert f"metrics: http://127.0.0.1:{port}/metrics" in out
    for name in (
        "regen_items",
        "regen_answers",
        "regen_run_answers",
        "regen_tokens",
        "regen_cost_usd",
        "regen_requests_in_flight",
        "regen_concurrency_limit",
        "regen_concurrency_configured",
        "regen_request_latency_seconds",
        "regen_run_elapsed_seconds",
        "regen_run_start_time_seconds",
        "regen_build_info",
    ):
        assert name in fams, name
    hist = fams["regen_request_latency_seconds"].samples
    count = next(s.value for s in hist if s.name.endswith("_count"))
    inf = next(s.value for s in hist if s.labels.get("le") == "+Inf")
    answered = value(fams, "regen_run_answers", outcome="done")
    assert count == inf >= answered >= 20
    assert value(fams, "regen_requests_in_flight") == 16
    assert value(fams, "regen_concurrency_configured") == 16
    assert naming_problems(text) == []
    # The key never shows up in what is served.
    assert SECRET_KEY not in text
