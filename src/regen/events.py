"""What the pipeline says as it goes: records of the standard library's `logging` under the
`regen` logger (each module's own, `regen.run.prepare` and so on), a line each with its level.
The stages only emit; listeners attached from above (`view/events.py`: the terminal, run.log)
decide where a line goes, so a run needs no terminal.

Levels say who a line is for: SAID (`logging.INFO`) and up, the person watching and run.log;
KEPT (`logging.DEBUG`), run.log only (the end's details, which the terminal shows as the
summary's tables instead). An event may carry fields beside its line (`fields(...)`: its
name and values), for a listener that wants data rather than words.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

SAID = logging.INFO
KEPT = logging.DEBUG

PIPELINE = logging.getLogger("regen")
# A caller that attaches no listener (a library use, a test) hears nothing, not logging's
# last-resort print of warnings to stderr.
PIPELINE.addHandler(logging.NullHandler())


def fields(event: str, **values: object) -> Mapping[str, Any]:
    """What `extra=` takes to send an event's name and values with its line."""
    return {"fields": {"event": event, **values}}


def fields_of(record: logging.LogRecord) -> dict[str, object]:
    """The fields an event carried (`fields`), {} for a line without."""
    return dict(getattr(record, "fields", None) or {})


@contextlib.contextmanager
def listening(listener: logging.Handler) -> Iterator[None]:
    """Attach `listener` to every event of the pipeline for the length of the block (the
    `regen` logger is opened down to the listener's level meanwhile, so KEPT lines reach
    run.log whatever the root logger's level)."""
    saved = PIPELINE.level
    PIPELINE.setLevel(min(PIPELINE.getEffectiveLevel(), listener.level or KEPT))
    PIPELINE.addHandler(listener)
    try:
        yield
    finally:
        PIPELINE.removeHandler(listener)
        PIPELINE.setLevel(saved)
        listener.close()
