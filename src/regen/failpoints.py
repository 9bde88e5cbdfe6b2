"""Named points where regen can be made to kill itself, for crash tests that act at an exact
moment instead of after a guessed delay.

`REGEN_CRASH_AT=POINT` makes the process send itself SIGKILL (nothing is flushed, no handler
runs: a lost machine) when it reaches POINT:

- `start`: dispatch is about to send the first request;
- `commit:N`: a commit has just brought this run's committed answers to N or more;
- `dataset:NAME`: a lane is about to hand out dataset NAME's first items (a dataset boundary);
- `read:NAME`: dataset NAME's rows are all stored, its read not yet recorded as complete;
- `export`: inside the run's export, one file written in full and not yet renamed into place;
- `export-swap`: inside `regen export`, between its two renames (the old folder moved aside,
  the new one not yet in place).

Unset, each point costs one comparison. It is read once, when this module is imported."""

from __future__ import annotations

import os
import signal

ENV = "REGEN_CRASH_AT"
POINTS = ("start", "commit", "dataset", "read", "export", "export-swap")


def _parse(raw: str | None) -> tuple[str, str] | None:
    if not raw:
        return None
    point, _, arg = raw.partition(":")
    if point not in POINTS:
        raise ValueError(f"{ENV}={raw!r}: unknown point (known: {', '.join(POINTS)})")
    if point == "commit" and not arg.isdigit():
        raise ValueError(f"{ENV}={raw!r}: commit needs a count, as in commit:40")
    return point, arg


_AT = _parse(os.environ.get(ENV))


def reached(point: str, arg: str = "", count: int = 0) -> None:
    """Kill this process if `REGEN_CRASH_AT` names this point (for `commit`, once `count`
    reaches its number)."""
    if _AT is None or _AT[0] != point:
        return
    if point == "commit" and count < int(_AT[1]):
        return
    if point in ("dataset", "read") and arg != _AT[1]:
        return
    os.kill(os.getpid(), signal.SIGKILL)
