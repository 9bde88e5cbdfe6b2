"""report.html: the job over time, run by run, with readable axes; rates in the unit their
axis names, counted over steps long enough that a lone event is not a spike; failed attempts
as a share of attempts; tokens per second, reasoning and content apart; lanes and
escalations; the endpoints; and per dataset the completion lengths marked at each lane's
max_tokens. Read back as a person would (the HTML parsed, the page opened in headless
Chromium) from a real job: a pilot, a run stopped by the dollar cap, and a second run with a
higher cap and a dataset added; and from a job over two endpoints. The arithmetic of the
charts is checked on a job made by hand, whose every event time is known."""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from regen.outputs.report import JobFacts, Report, render
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from regen.state.runs import RunRecord
from tests.conftest import (
    SECRET_KEY,
    chat_rows,
    query,
    run_cli,
    two_lanes,
    write_job,
    write_rows,
)

LANES = two_lanes(long_max_tokens=2048)
JOB_CHARTS = (
    "answers",
    "tokens",
    "prompt-tokens",
    "in-flight",
    "spend",
    "errors",
    "failure-share",
    "429s",
)
CLOCK = re.compile(r"^(\d\d-\d\d )?\d\d:\d\d(:\d\d)?$")


def job_file(tmp: Path, base_url: str, cap: float, datasets: list[str]) -> Path:
    return write_job(
        tmp,
        base_url,
        extra=f"[budget]\nmax_cost_usd = {cap}\n{LANES}",
        datasets=[(d, f"{d}.jsonl", "openai") for d in datasets],
    )


@pytest.fixture(scope="module")
def job_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pilot, a run that the $0.05 cap stops part way, and a run with a $0.15 cap and a
    second dataset; the platform's request-rate limit answers some requests 429."""
    tmp = tmp_path_factory.mktemp("job")
    write_rows(tmp / "a.jsonl", chat_rows(120, "Alpha"))
    write_rows(tmp / "b.jsonl", chat_rows(60, "Beta"))
    # time_scale > 0: answers take time, so the one-second sampler sees requests on the wire.
    with sim_in_thread(SimConfig(seed=3, time_scale=0.01, global_rps=40)) as sim:
        job = job_file(tmp, sim.base_url, 0.05, ["a"])
        plan = run_cli("plan", str(job), "--pilot", "5")
        assert plan.returncode == 0, plan.stderr
        first = run_cli("run", str(job))
        assert first.returncode == 4, first.stderr  # stopped by the dollar cap
        job = job_file(tmp, sim.base_url, 0.15, ["a", "b"])
        # a's own cap leaves b room under the job's, however far the first run got: without
        # it, where the first cap stopped (timing) decided whether b was answered at all.
        job.write_text(
            job.read_text().replace('path = "a.jsonl"', 'path = "a.jsonl"\nmax_cost_usd = 0.1')
        )
        second = run_cli("run", str(job))
        assert second.returncode in (0, 4), second.stderr
    return tmp / "out"


@pytest.fixture(scope="module")
def endpoints_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job served by two endpoints, `fast` and `slow` (two simulators, one slower, whose
    answers fail with a 5xx about one time in three: at one in five, the ten or so requests it
    gets drew none once bodies carried a session_id, since the sim's draws hash whole bodies)."""
    tmp = tmp_path_factory.mktemp("endpoints")
    write_rows(tmp / "a.jsonl", chat_rows(40, "Alpha"))
    with (
        sim_in_thread(SimConfig(seed=5, time_scale=0.0)) as fast,
        sim_in_thread(SimConfig(seed=6, time_scale=0.02, faults=SimFaults(http_5xx=0.3))) as slow,
    ):
        job = write_job(tmp, fast.base_url, datasets=[("a", "a.jsonl", "openai")])
        text = job.read_text()
        pool = "".join(
            f'[[endpoints]]\nname = "{name}"\nbase_url = "{sim.base_url}"\n'
            'api_key_env = "REGEN_TEST_KEY"\n\n'
            for name, sim in (("fast", fast), ("slow", slow))
        )
        job.write_text(text[: text.index("[endpoint]")] + pool + text[text.index("[generation]") :])
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stderr
    return tmp / "out"


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Element]:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag: str, cls: str | None = None) -> list[Element]:
        return [e for e in self.walk() if e.tag == tag and (cls is None or cls in e.classes())]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class Page(html.parser.HTMLParser):
    """The page as a tree; it fails on an element closed out of order."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.root = Element("#document", {})
        self.stack = [self.root]
        self.feed(text)
        self.close()
        assert self.stack == [self.root], [e.tag for e in self.stack]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        e = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(e)
        if tag not in self.VOID:
            self.stack.append(e)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.stack[-1].tag == tag, (tag, [e.tag for e in self.stack[-5:]])
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data

    def charts(self, name: str) -> list[Element]:
        return [s for s in self.root.find("svg") if s.attrs.get("data-chart") == name]

    def chart_title(self, name: str) -> str:
        """The heading over the one chart of this name."""
        (box,) = [
            d
            for d in self.root.find("div", "chartbox")
            if any(s.attrs.get("data-chart") == name for s in d.find("svg"))
        ]
        return box.find("h3")[0].all_text()

    def table(self, cls: str) -> list[dict[str, str]]:
        (t,) = self.root.find("table", cls)
        head = [th.all_text() for th in t.find("th")]
        return [
            dict(zip(head, (td.all_text() for td in tr.find("td")), strict=True))
            for tr in t.find("tbody")[0].find("tr")
        ]


def number(s: str) -> float:
    return float(s.replace(",", "").replace("$", "").removesuffix(" s"))


def drawn(svg: Element) -> list[list[tuple[float, float, float]]]:
    """Each series of a chart as a person reads it off the axes: (x where a step starts, x
    where it ends, the value its height stands for), mapped through the y tick labels."""
    ticks = [
        (float(t.attrs["y"]), number(t.all_text()))
        for t in svg.find("text", "tick")
        if "y" in t.classes()
    ]
    (y0, v0), (y1, v1) = ticks[0], ticks[-1]
    lines = []
    for path in svg.find("path", "series"):
        steps: list[tuple[float, float, float]] = []
        for cmd, args in re.findall(r"([MHV])([-\d.,]+)", path.attrs["d"]):
            if cmd == "M":
                x_text, y_text = args.split(",")
                x, y = float(x_text), float(y_text)
            elif cmd == "V":
                y = float(args)
            else:
                steps.append((x, float(args), v0 + (y - y0) / (y1 - y0) * (v1 - v0)))
                x = float(args)
        lines.append(steps)
    return lines


def y_title(svg: Element) -> str:
    (title,) = [t.all_text() for t in svg.find("text", "title") if "y" in t.classes()]
    return title


def assert_readable_axes(svg: Element, time_axis: bool) -> None:
    """Tick labels on both axes, gridlines, and axis titles with units."""
    x_ticks = [t.all_text() for t in svg.find("text", "tick") if "x" in t.classes()]
    y_ticks = [number(t.all_text()) for t in svg.find("text", "tick") if "y" in t.classes()]
    assert len(y_ticks) >= 3 and y_ticks[0] == 0 and y_ticks == sorted(y_ticks)
    steps = {round(b - a, 9) for a, b in zip(y_ticks, y_ticks[1:], strict=False)}
    assert len(steps) == 1  # evenly spaced
    (step,) = steps
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert round(mantissa, 6) in (1, 2, 5)  # a 1-2-5 step
    assert x_ticks
    if time_axis:
        assert all(CLOCK.match(t) for t in x_ticks), x_ticks
    assert len(svg.find("line", "grid")) >= len(y_ticks)
    titles = {t.all_text() for t in svg.find("text", "title")}
    assert len(titles) == 2 and all(titles)
    if time_axis:
        assert any(t.startswith("time, UTC") for t in titles)


def test_job_charts_mark_each_run_and_the_cap_on_readable_axes(job_out: Path) -> None:
    page = Page((job_out / "report.html").read_text())
    runs = query(job_out, "SELECT kind, max_cost_usd FROM runs ORDER BY id")
    assert runs == [("pilot", 0.05), ("run", 0.05), ("run", 0.15)]
    assert query(job_out, "SELECT COUNT(*) FROM attempts WHERE status = 429")[0][0] > 0
    for name in JOB_CHARTS:
        (svg,) = page.charts(name)
        assert_readable_axes(svg, time_axis=True)
        marks = [line.attrs["data-run"] for line in svg.find("line", "run-start")]
        assert marks == ["pilot", "run 1", "run 2"]
        assert [t.all_text() for t in svg.find("text", "run-label")] == marks
        # The time between runs is cut out of the axis and marked, not drawn as zero.
        assert len(svg.find("g", "gap")) == 2
    (spend,) = page.charts("spend")
    caps = [line.find("title")[0].all_text() for line in spend.find("line", "cap")]
    assert caps == ["dollar cap $0.05", "dollar cap $0.05", "dollar cap $0.15"]
    # The runs table attributes every answer and every dollar to the run that made it.
    rows = page.table("runs")
    assert [r["run"] for r in rows] == ["pilot", "run 1", "run 2"]
    assert (
        sum(number(r["answers"]) for r in rows)
        == query(job_out, "SELECT COUNT(*) FROM results")[0][0]
    )
    (spent,) = query(job_out, "SELECT SUM(cost_usd) FROM ledger")[0]
    assert sum(number(r["spent"]) for r in rows) == pytest.approx(spent, abs=1e-3)


def test_the_runs_table_says_how_each_run_ended_with_its_exit_code(job_out: Path) -> None:
    """The report a run writes as it ends shows that run's own exit code: it is written once
    the code is known."""
    rows = Page((job_out / "report.html").read_text()).table("runs")
    codes = query(job_out, "SELECT exit_code FROM runs WHERE kind = 'run' ORDER BY id")
    assert [c for (c,) in codes] == [4, codes[1][0]] and codes[1][0] in (0, 4)
    for row, (code,) in zip(rows[1:], codes, strict=True):
        assert row["ended"].endswith(f"(exit {code})"), row


def test_a_report_written_while_a_run_is_live_says_running_not_killed(tmp_path: Path) -> None:
    """`regen report` from another process while a run holds the directory: that run has no
    end recorded yet, and it is running, not killed. Once it ends, its row says how, with its
    exit code."""
    write_rows(tmp_path / "a.jsonl", chat_rows(60, "Alpha"))
    out = tmp_path / "out"
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("a", "a.jsonl", "openai")])
        sim.simulator.hold(after=10)  # 10 answers, then requests wait in flight
        run = subprocess.Popen(
            [sys.executable, "-m", "regen", "run", str(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY},
            text=True,
        )
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held > 0, 60)
            live = run_cli("report", str(out))
            assert live.returncode == 0, live.stderr
            (row,) = Page((out / "report.html").read_text()).table("runs")
            assert row["ended"] == "running", row
            run.send_signal(signal.SIGTERM)  # a graceful stop: what is in flight finishes
            sim.simulator.release()
            assert run.wait(timeout=60) == 5, run.communicate()
        finally:
            if run.poll() is None:
                run.kill()
            run.communicate()
    (row,) = Page((out / "report.html").read_text()).table("runs")
    assert row["ended"].startswith("interrupted") and row["ended"].endswith("(exit 5)"), row


def test_lanes_and_escalations_match_state_db(job_out: Path) -> None:
    page = Page((job_out / "report.html").read_text())
    lanes = {r["lane"]: r for r in page.table("lanes")}
    assert set(lanes) == {"short", "long"}
    assert lanes["short"]["escalates to"] == "long" and lanes["short"]["max_tokens"] == "256"
    done = dict(query(job_out, "SELECT lane, COUNT(*) FROM items WHERE status = 'done' GROUP BY 1"))
    escalated = dict(
        query(
            job_out,
            "SELECT lane, COUNT(*) FROM items WHERE status = 'done' AND escalated = 1 GROUP BY 1",
        )
    )
    limited = dict(
        query(
            job_out,
            "SELECT lane, COUNT(*) FROM attempts "
            "WHERE status = 429 OR failure_class = 'rate_limited' GROUP BY 1",
        )
    )
    assert escalated.get("long", 0) > 0
    for lane, row in lanes.items():
        assert number(row["answers"]) == done.get(lane, 0)
        assert number(row["of which escalated here"]) == escalated.get(lane, 0)
        assert number(row["429s"]) == limited.get(lane, 0)
    (note,) = page.root.find("p", "escalations")
    found = re.match(r"([\d,]+) truncated answers were escalated", note.all_text())
    assert found is not None
    (charges,) = query(job_out, "SELECT COUNT(*) FROM ledger WHERE kind = 'escalated'")[0]
    assert number(found.group(1)) == charges > 0


def test_length_histograms_are_marked_at_each_lanes_max_tokens(job_out: Path) -> None:
    page = Page((job_out / "report.html").read_text())
    assert [h.all_text() for h in page.root.find("h2")] == ["a", "b"]
    histograms = page.charts("lengths")
    assert len(histograms) == 2
    for svg in histograms:
        assert_readable_axes(svg, time_axis=False)
        marks = {line.attrs["data-lane"] for line in svg.find("line", "max-tokens")}
        assert marks == {"short", "long"}
        labels = {t.all_text() for t in svg.find("text", "max-label")}
        assert labels == {"short 256", "long 2,048"}
    for svg in page.charts("throughput"):
        assert_readable_axes(svg, time_axis=True)
        assert len(svg.find("line", "run-start")) == 3


def test_report_is_self_contained(job_out: Path) -> None:
    text = (job_out / "report.html").read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", text)
    # A few hundred SVG elements, not one per answer or per timeline sample.
    assert text.count("<rect") + text.count("<line") + text.count("<path") < 3000


@pytest.mark.parametrize("made_by", ["regen without runs", "regen with runs, none recorded"])
def test_a_state_db_without_runs_still_renders(job_out: Path, tmp_path: Path, made_by: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(job_out, out)
    db = sqlite3.connect(out / "state.db")
    try:
        if made_by == "regen without runs":  # the schema before m007_runs
            db.executescript(
                "DROP TABLE timeline; DROP TABLE runs; ALTER TABLE attempts DROP COLUMN lane; "
                "DELETE FROM schema_migrations WHERE version >= 7;"
            )
        else:
            db.executescript("DELETE FROM timeline; DELETE FROM runs;")
    finally:
        db.close()
    res = run_cli("report", str(out), "--to", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    page = Page((tmp_path / "r.html").read_text())
    (note,) = page.root.find("p", "note")
    assert "runs" in note.all_text()
    for name in ("answers", "tokens", "prompt-tokens", "spend", "errors", "429s"):
        (svg,) = page.charts(name)
        assert_readable_axes(svg, time_axis=True)
        assert not svg.find("line", "run-start") and not svg.find("line", "cap")
    assert not page.charts("in-flight")
    # Answers name their endpoint from schema 10 on; before, they are counted apart.
    endpoints = [r["endpoint"] for r in page.table("endpoints")]
    assert endpoints == (["(not recorded)"] if made_by == "regen without runs" else ["default"])
    assert [h.all_text() for h in page.root.find("h2")] == ["a", "b"]
    assert len(page.charts("lengths")) == 2


T0 = 1_700_000_000.0


def one_run(seconds: float, **facts: Any) -> Page:
    """The report of a job made by hand: one run of `seconds` from T0, with these facts."""
    run = RunRecord(1, "run", T0, T0 + seconds, None, None, {})
    job = JobFacts(
        runs=[run], recorded=True, run_answers=[0], run_usd=[0.0], run_last=[run.ended_at], **facts
    )
    return Page(render(Path("out"), Report(job, [])))


def values(line: list[tuple[float, float, float]]) -> list[float]:
    return [v for _, _, v in line]


def test_a_lone_failure_in_a_five_minute_run_reads_as_one_a_minute_not_as_a_spike() -> None:
    # One failed attempt (a 429) in the middle and one in the run's last second: counted over
    # steps of 2 s they read as 30 and 60 a minute.
    page = one_run(
        301,
        failures=[(T0 + 150, "rate_limited", "short"), (T0 + 300.5, "rate_limited", "short")],
        rate_limited=[(T0 + 150, "short"), (T0 + 300.5, "short")],
    )
    for name, unit in (("errors", "failed attempts/min"), ("429s", "429s/min")):
        (svg,) = page.charts(name)
        assert y_title(svg) == unit
        assert "counted over steps of 1 min" in page.chart_title(name)
        (line,) = drawn(svg)
        # A minute's step holds each; the last step runs to the end (61 s).
        assert values(line) == pytest.approx([0, 0, 1, 0, 60 / 61], abs=0.02)
        # The area under a rate is the count: each step's value times its minutes.
        width = line[-1][1] - line[0][0]
        area = sum(v * (x1 - x0) / width * 301 / 60 for x0, x1, v in line)
        assert area == pytest.approx(2, abs=0.05)


def test_tokens_per_second_keep_reasoning_content_and_prompt_apart() -> None:
    # One answer a second for the first two minutes of a four-minute run, each of 100 prompt
    # tokens and 50 completion tokens, 20 of them reasoning.
    n = 120
    page = one_run(
        240,
        answers=array("d", (T0 + i for i in range(n))),
        answer_prompt=array("q", [100] * n),
        answer_completion=array("q", [50] * n),
        answer_reasoning=array("q", [20] * n),
    )
    (answers,) = drawn(page.charts("answers")[0])
    assert values(answers) == pytest.approx([1, 1, 0, 0], abs=0.01)
    (svg,) = page.charts("tokens")
    assert y_title(svg) == "completion tokens/s"
    completion, reasoning, content = drawn(svg)
    assert values(completion) == pytest.approx([50, 50, 0, 0], abs=0.2)
    assert values(reasoning) == pytest.approx([20, 20, 0, 0], abs=0.2)
    assert values(content) == pytest.approx([30, 30, 0, 0], abs=0.2)
    (svg,) = page.charts("prompt-tokens")
    assert y_title(svg) == "prompt tokens/s"
    (prompt,) = drawn(svg)
    assert values(prompt) == pytest.approx([100, 100, 0, 0], abs=0.5)


def test_failed_attempts_are_drawn_as_a_share_of_the_attempts_started() -> None:
    # An attempt every 6 s (10 a minute) for five minutes; one fails in the third minute and
    # two in the fourth.
    failures = [(T0 + 150, "http_5xx", "short"), (T0 + 198, "timeout", "short")]
    failures.append((T0 + 204, "timeout", "short"))
    page = one_run(300, attempts=array("d", (T0 + 6 * i for i in range(50))), failures=failures)
    (svg,) = page.charts("failure-share")
    assert y_title(svg) == "% of attempts started that failed"
    assert "6.0% of all attempts" in page.chart_title("failure-share")
    every, http_5xx, timeout = drawn(svg)
    assert values(every) == pytest.approx([0, 0, 10, 20, 0], abs=0.1)
    assert values(http_5xx) == pytest.approx([0, 0, 10, 0, 0], abs=0.1)
    assert values(timeout) == pytest.approx([0, 0, 0, 20, 0], abs=0.1)


def test_each_dataset_counts_its_answers_tokens_reasoning_and_content_apart(job_out: Path) -> None:
    page = Page((job_out / "report.html").read_text())
    tables = page.root.find("table", "ds-tokens")
    sums = query(
        job_out,
        "SELECT COUNT(r.item_id), COALESCE(SUM(r.prompt_tokens), 0), "
        "COALESCE(SUM(r.completion_tokens), 0), COALESCE(SUM(r.reasoning_tokens), 0) "
        "FROM datasets d LEFT JOIN results r ON r.dataset = d.name "
        "GROUP BY d.name ORDER BY d.position",
    )
    assert len(tables) == len(sums) == 2
    for table, (answers, prompt, completion, reasoning) in zip(tables, sums, strict=True):
        head = [th.all_text() for th in table.find("th")]
        row = dict(zip(head, (td.all_text() for td in table.find("td")), strict=True))
        assert number(row["answers"]) == answers
        assert number(row["prompt tok"]) == prompt
        assert number(row["completion tok"]) == completion
        assert number(row["reasoning tok"]) == reasoning
        assert number(row["content tok"]) == completion - reasoning
        assert row["reasoning"] == (f"{reasoning / completion:.1%}" if completion else "-")
    # The simulated model reasons and then answers: both parts are there to be told apart.
    _, _, completion, reasoning = sums[0]
    assert 0 < reasoning < completion


def test_each_endpoint_has_its_answers_tokens_cost_and_latency(endpoints_out: Path) -> None:
    page = Page((endpoints_out / "report.html").read_text())
    rows = {r["endpoint"]: r for r in page.table("endpoints")}
    assert set(rows) == {"fast", "slow"}
    for name, row in rows.items():
        ((answers, prompt, completion, reasoning, cost),) = query(
            endpoints_out,
            "SELECT COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
            f"SUM(reasoning_tokens), SUM(cost_usd) FROM results WHERE endpoint = '{name}'",
        )
        assert number(row["answers"]) == answers > 0
        assert number(row["prompt tok"]) == prompt
        assert number(row["completion tok"]) == completion
        assert number(row["reasoning tok"]) == reasoning
        assert number(row["content tok"]) == completion - reasoning
        assert number(row["cost of answers"]) == pytest.approx(cost, abs=1e-4)
        lat = sorted(
            t
            for (t,) in query(
                endpoints_out, f"SELECT latency_s FROM results WHERE endpoint = '{name}'"
            )
        )
        assert number(row["mean latency"]) == pytest.approx(sum(lat) / len(lat), abs=0.006)
        deciles = statistics.quantiles(lat, n=10, method="inclusive")
        assert number(row["p50 latency"]) == pytest.approx(deciles[4], abs=0.006)
        assert number(row["p90 latency"]) == pytest.approx(deciles[8], abs=0.006)
        ((failed,),) = query(
            endpoints_out,
            "SELECT COUNT(*) FROM attempts WHERE failure_class IS NOT NULL "
            f"AND endpoint = '{name}'",
        )
        assert number(row["failed attempts"].split()[0]) == failed
        assert row["outages"] == "0"  # hosted endpoints are never taken out of a pool
    # The slow simulator answers slower and fails now and then, and the table says so.
    assert number(rows["slow"]["failed attempts"].split()[0]) > 0
    assert rows["fast"]["failed attempts"] == "0"
    assert number(rows["slow"]["p50 latency"]) > number(rows["fast"]["p50 latency"])
    (svg,) = page.charts("endpoint-tokens")
    assert_readable_axes(svg, time_axis=True)
    assert y_title(svg) == "completion tokens/s"
    assert len(drawn(svg)) == 2


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """A headless-capable Chromium under its usual names (`.ci/run` installs Debian's).

    Without one the test is skipped with its reason (listed by `-ra`), so `make test` passes
    on a machine with only python3, make and PyPI; where a browser is promised
    (REGEN_REQUIRE_BROWSER=1, set by `.ci/run` once it installed one) a missing one fails."""
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    why = f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)})"
    if os.environ.get("REGEN_REQUIRE_BROWSER"):
        pytest.fail(f"{why}, and REGEN_REQUIRE_BROWSER is set: install one (Debian: chromium)")
    pytest.skip(f"{why}: the report is not opened in a browser here")


def headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1600",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


# Appended to a copy of the page (the report itself has no script): what the browser laid out.
PROBE = """<script>
window.onerror = (m) => document.documentElement.setAttribute("data-error", String(m));
const sizes = [...document.querySelectorAll("svg")].map((s) => {
  const r = s.getBoundingClientRect();
  return Math.round(r.width) + "x" + Math.round(r.height);
});
document.body.setAttribute("data-svg-sizes", sizes.join(" "));
</script>"""


@pytest.mark.browser
@pytest.mark.parametrize(
    ("out", "charts"), [("job_out", JOB_CHARTS), ("endpoints_out", ("endpoint-tokens",))]
)
def test_report_renders_in_headless_chromium(
    out: str, charts: tuple[str, ...], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    job_out: Path = request.getfixturevalue(out)
    page = (job_out / "report.html").read_text()
    shot = tmp_path / "report.png"
    res = headless(tmp_path, f"--screenshot={shot}", (job_out / "report.html").as_uri())
    assert res.returncode == 0, res.stderr
    assert shot.stat().st_size > 10_000
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    res = headless(tmp_path, "--dump-dom", probe.as_uri())
    assert res.returncode == 0, res.stderr
    dom = Page(res.stdout).root
    (html_el,) = dom.find("html")
    assert "data-error" not in html_el.attrs
    (body,) = dom.find("body")
    sizes = body.attrs["data-svg-sizes"].split()
    assert len(sizes) == page.count("<svg")
    assert {s.attrs["data-chart"] for s in dom.find("svg")} >= set(charts)
    for size in sizes:
        width, height = (int(v) for v in size.split("x"))
        assert width > 100 and height > 100, sizes
