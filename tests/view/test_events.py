"""The pipeline's events and their listeners: the stages say, the terminal and run.log listen."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from rich.console import Console

from regen.config import load_job
from regen.errors import StateError
from regen.events import fields_of, listening
from regen.run.runner import run_job
from regen.sim import SimConfig, sim_in_thread
from regen.view.events import RunLogListener, TerminalListener
from tests.engine.test_selfhosted import MODEL, job_file

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def test_the_terminal_shows_what_is_said_and_run_log_keeps_every_line(tmp_path: Path) -> None:
    out = io.StringIO()
    stage = logging.getLogger("regen.run.somestage")
    with (
        listening(TerminalListener(Console(file=out, width=40))),
        listening(RunLogListener(tmp_path / "run.log")),
    ):
        stage.info("dataset a: new, 3 items [bold]not markup[/bold] \x1b]0;title\x07")
        stage.debug("reconcile account=x provider_usd=0.1 ledger_usd=0.1 difference_usd=0")
        stage.info("a line longer than the console's forty columns stays one line")
    said = "dataset a: new, 3 items [bold]not markup[/bold] \\x1b]0;title\\x07"
    assert out.getvalue().splitlines() == [
        said,
        "a line longer than the console's forty columns stays one line",
    ]
    log = (tmp_path / "run.log").read_text().splitlines()
    assert [re.sub(f"^{STAMP} ", "", line) for line in log] == [
        said,
        "reconcile account=x provider_usd=0.1 ledger_usd=0.1 difference_usd=0",
        "a line longer than the console's forty columns stays one line",
    ]
    assert all(re.match(f"^{STAMP} ", line) for line in log)


def test_a_run_log_that_cannot_be_opened_fails_the_stage_that_says_first(tmp_path: Path) -> None:
    (tmp_path / "run.log").mkdir()  # a directory where the file should be
    with (
        listening(RunLogListener(tmp_path / "run.log")),
        pytest.raises(StateError, match="run.log: cannot write"),
    ):
        logging.getLogger("regen.run.prepare").info("dataset a: new")


def test_a_run_log_that_fails_later_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    out = io.StringIO()
    stage = logging.getLogger("regen.run.somestage")
    listener = RunLogListener(tmp_path / "run.log")
    with listening(TerminalListener(Console(file=out, width=200))), listening(listener):
        stage.info("first")
        assert listener._log is not None and listener._log._file is not None
        listener._log._file.close()
        listener._log._file = open("/dev/full", "w")  # noqa: SIM115  # a disk that is full
        stage.info("second")
        stage.info("third")
    shown = out.getvalue().splitlines()
    assert shown[:2] == ["first", "second"] and shown[3] == "third"
    assert re.fullmatch(
        r"warning: run.log is no longer written: .*No space left on device", shown[2]
    )
    assert len(shown) == 4
    assert (tmp_path / "run.log").read_text().endswith(" first\n")


def test_a_run_started_from_code_keeps_its_run_log_and_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=3, time_scale=0.0)
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=False)
        report = run_job(load_job(job))
    assert report.failed == 0 and not report.stop_reason
    assert capsys.readouterr().out == ""
    log = (tmp_path / "out" / "run.log").read_text()
    assert re.search(f"^{STAMP} dataset chat: new, 24 items$", log, re.M)
    assert re.search(f"^{STAMP} progress ", log, re.M)


class Collected(logging.Handler):
    """A listener that keeps each event's level, line and fields, as a program embedding regen
    might."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[int, str, dict[str, object]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((record.levelno, record.getMessage(), fields_of(record)))


def test_a_listener_gets_each_events_level_line_and_fields(tmp_path: Path) -> None:
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=3, time_scale=0.0)
    collected = Collected()
    with sim_in_thread(config) as sim, listening(collected):
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=False)
        # No prompt is this short: every item is left unsent, and the end says why.
        job.write_text(
            job.read_text().replace('name = "main"', 'name = "main"\nmax_prompt_tokens = 1')
        )
        run_job(load_job(job))
    starts = [e for e in collected.events if e[2].get("event") == "dataset_start"]
    assert starts == [
        (
            logging.INFO,
            "dataset chat: new, 24 items",
            {
                "event": "dataset_start",
                "dataset": "chat",
                "items": 24,
                "done": 0,
                "failed": 0,
                "pending": 24,
            },
        )
    ]
    log = (tmp_path / "out" / "run.log").read_text()
    unsent = [e for e in collected.events if e[2].get("event") == "unsent"]
    assert [(level, about["items"], about["kind"]) for level, _, about in unsent] == [
        (logging.DEBUG, 24, "left")
    ]
    assert f" {unsent[0][1]}\n" in log and "no lane selects them" in unsent[0][1]
