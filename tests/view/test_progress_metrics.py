"""What a person watching sees without a TTY (progress lines), the ETA, and the report written
at the end (metrics: test_metrics.py; the report's charts and the browser: test_report.py)."""

from __future__ import annotations

import html.parser
import re
from pathlib import Path

from regen.engine.eta import Flow, kaplan_meier, lane_eta
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import chat_rows, run_cli, write_job, write_rows

LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) progress (.*)$")
REQUIRED = (
    "done",
    "failed",
    "in_flight",
    "req_s",
    "req_s_1m",
    "out_tok_s",
    "out_tok_s_1m",
    "eta_s",
    "eta_p10_s",
    "eta_p90_s",
    "completion_tokens",
    "cost_usd",
    "usd_per_mtok",
    "errors",
    "elapsed_s",
)


def parse_progress(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append(dict(kv.split("=", 1) for kv in m.group(2).split()))
    return out


def test_progress_lines_without_a_tty_parse_and_add_up(tmp_path: Path) -> None:
    write_rows(tmp_path / "a.jsonl", chat_rows(60, "Alpha"))
    write_rows(tmp_path / "b.jsonl", chat_rows(40, "Beta"))
    with sim_in_thread(SimConfig(seed=3, time_scale=0.02)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")],
            concurrency=8,
        )
        res = run_cli("run", str(job))
    assert res.returncode == 0, res.stderr
    lines = parse_progress(res.stdout)
    assert len(lines) >= 3
    assert parse_progress((tmp_path / "out" / "run.log").read_text()) == lines
    for fields in lines:
        for key in REQUIRED:
            assert key in fields, (key, fields)
        done, total = map(int, fields["done"].split("/"))
        assert total == 100 and 0 <= done <= total
        a_done, b_done = (int(fields[k].split("/")[0]) for k in ("a", "b"))
        assert a_done + b_done == done
        assert re.fullmatch(r"\d+/\d+/8", fields["lane_default"])
        for key in ("req_s", "req_s_1m", "out_tok_s", "cost_usd", "usd_per_mtok"):
            float(fields[key])
        if fields["eta_s"] != "-":
            p10, eta, p90 = (float(fields[k]) for k in ("eta_p10_s", "eta_s", "eta_p90_s"))
            assert 0 <= p10 <= eta <= p90
    # Done counts never go back; the last line is the end.
    dones = [int(f["done"].split("/")[0]) for f in lines]
    assert dones == sorted(dones)
    assert lines[-1]["done"] == "100/100" and lines[-1]["eta_s"] == "0"
    assert any(f["eta_s"] not in ("-", "0") for f in lines)  # an ETA was shown on the way


def test_eta_counts_requests_in_flight_as_censored_not_as_short() -> None:
    # Half the answers took 1 s; the other half are still running after 5 s. Taking only the
    # finished ones would say 1 s; Kaplan-Meier knows the rest take at least 5 s.
    model = kaplan_meier([1.0] * 50, [5.0] * 50)
    assert model is not None and model.mean > 3.0
    flow = Flow(remaining=1000)
    for _ in range(200):
        flow.add_latency(2.0)
    (eta,) = lane_eta([(flow, 1000, "count")], now=0.0, concurrency=10.0, concurrency_rsd=0.0)
    assert eta is not None
    assert eta.p10 <= eta.seconds <= eta.p90
    assert 1000 * 2.0 / 10 <= eta.seconds <= 1000 * 2.0 / 10 + 5  # work / slots + a drain
    # A token budget that allows only 100 more items ends the work first.
    flow.finished, flow.tokens = 200, 200 * 50
    (eta_b,) = lane_eta([(flow, 100, "budget")], now=0.0, concurrency=10.0, concurrency_rsd=0.0)
    assert eta_b is not None and eta_b.bound == "budget" and eta_b.seconds < eta.seconds / 5


class _Checker(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.h2: list[str] = []
        self.svgs = 0
        self._in_h2 = False

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        self.stack.append(tag)
        self.svgs += tag == "svg"
        self._in_h2 = tag == "h2"

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()
        self._in_h2 = False

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self.h2.append(data)


def test_report_is_written_at_the_end_and_on_demand(tmp_path: Path) -> None:
    write_rows(tmp_path / "a.jsonl", chat_rows(30, "Alpha"))
    write_rows(tmp_path / "b.jsonl", chat_rows(20, "Beta"))
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")],
        )
        assert run_cli("run", str(job)).returncode == 0
    page = (tmp_path / "out" / "report.html").read_text()
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == []  # every element closed: well formed
    assert checker.h2 == ["a", "b"]
    # Per dataset a length histogram, and a throughput curve when the run lasted a few
    # seconds (this one did not: it says so instead).
    assert checker.svgs >= 2
    assert page.count("throughput (answers per minute)") == 2
    for text in ("providers that served", "failed attempts by class", "p50", "p99", "$/Mtok"):
        assert text in page
    assert "<script" not in page and "http" not in page.split("</style>")[1].split("<p>")[0]
    res = run_cli("report", str(tmp_path / "out"), "--to", str(tmp_path / "r.html"))
    assert res.returncode == 0 and (tmp_path / "r.html").exists()
    res = run_cli("report", str(tmp_path / "nothing"))
    assert res.returncode == 1 and res.stderr.startswith("error: ")


def test_budget_left_counts_token_budgets_dataset_caps_and_the_job_cap() -> None:
    from regen.config import DatasetConfig
    from regen.engine.budget import BudgetBook
    from regen.state.work import DatasetProgress

    datasets = [
        DatasetConfig(name="a", path="a.jsonl", token_budget=1000, max_cost_usd=5.0),
        DatasetConfig(name="b", path="b.jsonl"),
    ]
    progress = [
        DatasetProgress("a", 0, 10, 0, 10, 10, 4, 0, 100, 400, 1.5),
        DatasetProgress("b", 1, 10, 0, 10, 10, 0, 0, 0, 0, 0.0),
    ]
    book = BudgetBook(datasets, progress, job_max_cost_usd=2.0)
    assert book.left("a") == (600.0, 0.5)  # the job's $0.50 left binds before a's $3.50
    assert book.left("b") == (None, 0.5)
    assert BudgetBook(datasets, progress).left("b") == (None, None)
