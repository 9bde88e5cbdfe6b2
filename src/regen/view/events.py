"""The pipeline's listeners (`regen/events.py`): the terminal, which shows each line said on
a rich console as it always looked, and run.log, which keeps every line with its time."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from regen.errors import StateError
from regen.events import KEPT, PIPELINE, SAID
from regen.safe import printable
from regen.view.progress import RunLog


class TerminalListener(logging.Handler):
    """The terminal as one listener: each line said (SAID and up) printed as one line, its
    control characters escaped, never read as markup."""

    def __init__(self, console: Console) -> None:
        super().__init__(SAID)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        line = printable(record.getMessage())
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


class RunLogListener(logging.Handler):
    """run.log as one listener: every line (KEPT and up), stamped with its UTC time. The file
    is opened at the first line; a file that cannot be opened fails the stage that said it
    (before the first request: `prepare` says first); a write that fails later (a full disk)
    is said once and the run goes on without its log."""

    def __init__(self, path: Path) -> None:
        super().__init__(KEPT)
        self.path = path
        self._log: RunLog | None = None
        self._broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._broken:
            return
        if self._log is None:
            self._log = RunLog(self.path)  # StateError reaches the stage that said the line
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            self._log.write(f"{stamp} {record.getMessage()}")
        except StateError as exc:
            self._broken = True
            self.close()
            PIPELINE.warning(f"warning: run.log is no longer written: {exc}")

    def close(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            log.close()
        super().close()
