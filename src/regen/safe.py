"""What regen does with text it did not write before the text reaches a file or a terminal.

Keys: every key regen holds (an endpoint's, a management key, a key made for a run) is
registered as it is read, and `redact` takes each out of any text, wherever the text came from
(a server that echoes its Authorization header into an error, a provider name or an answer).

Terminals: `printable` shows control and escape characters as escapes (`\\x1b`, `\\r`, `\\u202e`),
so a server's or a dataset's text cannot clear, rewrite or retitle the operator's screen. What
is shown or logged goes through it; an answer's stored text stays byte-exact (only keys are
taken out of it).

Streams: `RedactedText` is a text stream that redacts whatever is written to it; stdout and
stderr are one while a command runs (cli), and so is every file regen writes through `create`
and `append` (run.log, exports, their cards, the report), so a new call site cannot forget it.

Names: `checked_name` holds a name read from state.db (a dataset's) to the job file's rule.

Paths: a folder regen writes in (the output directory, or the folder an export or a report is
written to) is the user's, taken as it is; below it, `confined` refuses, before anything is
written or deleted, a path that is or passes through a link leading out of that folder (a link
that stays inside is followed). Every file regen writes or deletes there goes through the
functions below (`make_dirs`, `create`, `append`, `write_text_atomic`, `remove`); `remove`
never follows a link, and a file is created only where nothing is (no link is opened).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, cast

from regen.errors import StateError

REDACTED = "[redacted key]"
_MIN_SECRET = 8
"""Shorter values are not taken for keys (a test key of 3 letters would eat words)."""

_secrets: tuple[str, ...] = ()
"""The registered keys, longest first (a key that holds another is taken out whole)."""


def register_secret(value: str | None) -> None:
    """A key regen holds: from now on `redact` takes it out of every text."""
    global _secrets
    if value and len(value.strip()) >= _MIN_SECRET and value.strip() not in _secrets:
        _secrets = tuple(sorted({*_secrets, value.strip()}, key=len, reverse=True))


def redact(text: str, mark: str = REDACTED) -> str:
    """`text` with every registered key replaced by `mark` (REDACTED, or its spelling in a
    markup that would take it for a tag)."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, mark)
    return text


def redact_values(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, text; bytes and numbers as they are) with every key
    taken out of its text, for writers that take values rather than text (Parquet)."""
    if not _secrets:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_values(v) for v in value)
    return value


def has_key(text: str) -> bool:
    """Whether `text` holds a registered key."""
    # A loop, not any(): no generator per call, for ingest checks every text of every row.
    for secret in _secrets:  # noqa: SIM110
        if secret in text:
            return True
    return False


def holds_keys() -> bool:
    """Whether any key is registered (with none, nothing needs redacting)."""
    return bool(_secrets)


class RedactedText:
    """A text stream that takes every registered key out of what is written to it, and
    otherwise behaves as the stream it wraps (`redacted` makes one)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # flush, fileno, isatty, encoding, close...

    def __enter__(self) -> TextIO:
        return cast(TextIO, self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.inner.close()


def redacted(stream: TextIO) -> TextIO:
    """`stream`, every key taken out of what is written to it (a stream already redacted is
    returned as it is)."""
    if isinstance(stream, RedactedText):
        return cast(TextIO, stream)
    return cast(TextIO, RedactedText(stream))


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


# The rule for dataset, lane and endpoint names: the job file holds them to it (config.py), and
# what state.db names is held to it again here, below the job file's module, as names become
# file names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NAME_MAX = 100
NAME = re.compile(NAME_PATTERN)


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


def within(path: Path, root: Path) -> bool:
    """`path` is `root` or below it as written (`..` is not undone here: see `confined`)."""
    full, top = path.absolute(), root.absolute()
    return full == top or top in full.parents


def root_for(path: Path, out_dir: Path) -> Path:
    """The folder a path regen writes is confined to: the output directory when the path is
    in it (the default places), else the folder the user named it in (`--to DIR`'s parent)."""
    return out_dir if within(path, out_dir) else path.parent


def confined(root: Path, path: Path) -> Path:
    """`path`, once checked, before anything is written or deleted there, to stay in `root`:
    no part of it below `root` may be, or pass through, a link (or a `..`) that leads out of
    `root`; a link that stays inside is followed. Raises StateError naming the path."""
    if not within(path, root):
        raise StateError(f"{path}: would be written outside {root}; nothing was written there")
    base = root.resolve()
    step = root.absolute()
    for part in path.absolute().relative_to(step).parts:
        step = step / part
        real = step.resolve()  # links and `..` undone in order, as the kernel would
        if real != base and base not in real.parents:
            raise StateError(_leads_out(step, real, root))
    return path


def confined_tree(root: Path, path: Path) -> Path:
    """`path` confined, and every link below it too (walked without following any): for a
    folder regen reads through, carries over or deletes whole (a previous export)."""
    confined(root, path)
    if path.is_dir() and not path.is_symlink():
        for folder, dirs, files in os.walk(path):  # a linked folder is listed, not entered
            for name in dirs + files:
                if (entry := Path(folder) / name).is_symlink():
                    confined(root, entry)
    return path


def _leads_out(step: Path, real: Path, root: Path) -> str:
    what = "is a link" if step.is_symlink() else "leads"
    return (
        f"{step} {what} to {real}, outside {root}: regen writes and deletes nothing through a "
        "link that leads out of the folder it writes in, and has touched nothing; put a real "
        "folder (or file) in its place, or give the folder it points to, and run it again"
    )


def make_dirs(root: Path, path: Path) -> Path:
    """The folder `path` (and its parents below `root`), made where missing."""
    confined(root, path).mkdir(parents=True, exist_ok=True)
    return path


def remove(root: Path, path: Path) -> None:
    """Delete `path`, a file or a folder with all it holds, never following a link: a link
    (there or anywhere below) is removed itself, never what it points to, and one that leads
    out of `root` refuses the whole deletion before anything goes. Missing: nothing."""
    confined_tree(root, path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink(missing_ok=True)
    elif path.is_dir():
        # Descends by file descriptors, unlinking the links it meets (shutil's safe variant).
        shutil.rmtree(path)


def create(root: Path, path: Path) -> TextIO:
    """A new text file at `path` for writing, every key taken out of what is written: what
    was there is removed first (a link is removed, its target never opened), and the file is
    created only where nothing is (O_EXCL), so no link is followed."""
    confined(root, path)
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() or not path.is_dir():
            path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return redacted(open(fd, "w", encoding="utf-8"))  # noqa: SIM115 - the caller closes it


def append(root: Path, path: Path) -> TextIO:
    """`path` opened to append text, every key taken out of what is written."""
    return redacted(confined(root, path).open("a", encoding="utf-8"))


def write_text_atomic(root: Path, path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, flush it to disk, and rename it into
    place: a reader sees the old file or the new one, never half of one. Keys are taken out."""
    confined(root, path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with create(root, tmp) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            remove(root, tmp)
        raise
