"""What regen does with text it did not write before the text reaches a file or a terminal.

Keys: every key regen holds (an endpoint's, a management key, a key made for a run) is
registered as it is read, and `redact` takes each out of any text, wherever the text came from
(a server that echoes its Authorization header into an error, a provider name or an answer).

Terminals: `printable` shows control and escape characters as escapes (`\\x1b`, `\\r`, `\\u202e`),
so a server's or a dataset's text cannot clear, rewrite or retitle the operator's screen. What
is shown or logged goes through it; an answer's stored text stays byte-exact (only keys are
taken out of it).

Names: `checked_name` holds a name read from state.db (a dataset's) to the job file's rule,
and `inside` checks that a path regen writes stays in its folder once links are resolved.
"""

from __future__ import annotations

import re
from pathlib import Path

from regen.config import NAME_MAX, NAME_PATTERN
from regen.errors import StateError

REDACTED = "[redacted key]"
_MIN_SECRET = 8
"""Shorter values are not taken for keys (a test key of 3 letters would eat words)."""

_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """A key regen holds: from now on `redact` takes it out of every text."""
    if value and len(value.strip()) >= _MIN_SECRET:
        _secrets.add(value.strip())


def redact(text: str) -> str:
    """`text` with every registered key replaced by REDACTED."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
"""C0 and C1 controls (ESC starts every terminal escape sequence; CSI is \\x9b), line and
paragraph separators and the bidirectional overrides (text that displays reordered). Tab and
newline are handled by `printable`'s caller's choice."""


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` safe for a terminal or a log line: keys redacted, control characters escaped;
    newlines too, unless `newlines` (one line stays one line)."""
    text = _CONTROL.sub(_escape, redact(text))
    if not newlines:
        text = text.replace("\n", "\\n")
    return text


NAME = re.compile(NAME_PATTERN)
"""The rule job.toml holds dataset, lane and endpoint names to (and at most NAME_MAX long)."""


def checked_name(name: str, where: str) -> str:
    """A name read back from state.db, held to the job file's rule: a state.db copied from
    elsewhere may name a dataset `../../x`, and names become file names."""
    if not NAME.fullmatch(name) or len(name) > NAME_MAX:
        raise StateError(
            f"{where}: names a dataset {printable(name)[:120]!r}, which is not a name a job "
            "file allows (letters, digits, _ . -): this state.db was not written by regen "
            "as it is; do not export from it"
        )
    return name


def inside(root: Path, path: Path) -> Path:
    """`path`, once checked to stay under `root` with links resolved."""
    base = root.resolve()
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise StateError(f"{path}: would be written outside {root}; nothing was written there")
    return path
