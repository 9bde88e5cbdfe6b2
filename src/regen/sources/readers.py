"""File readers. Each yields (row_index, row dict) or (row_index, reason) for an unreadable row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from regen.errors import SourceError

Row = tuple[int, dict[str, Any] | str]


def read_rows(path: Path, reader: str = "auto") -> Iterator[Row]:
    """Rows of a JSONL or JSON-list file; a file that cannot be opened is a SourceError."""
    kind = reader if reader != "auto" else _guess_kind(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    if kind == "jsonl":
        return _read_jsonl(path)
    if kind == "json":
        return _read_json_list(path)
    raise SourceError(f"{path}: unknown reader {kind!r} (allowed: jsonl, json)")


def _guess_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    raise SourceError(
        f'{path}: cannot tell the file type from \'{suffix}\'; set reader = "jsonl" or "json"'
    )


def _read_jsonl(path: Path) -> Iterator[Row]:
    # Streamed line by line: a large file is never loaded whole.
    try:
        with path.open("rb") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    yield i, f"invalid JSON: {exc}"
                    continue
                yield (i, row) if isinstance(row, dict) else (i, "row is not a JSON object")
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from exc


def _read_json_list(path: Path) -> Iterator[Row]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    for i, row in enumerate(data):
        yield (i, row) if isinstance(row, dict) else (i, "row is not a JSON object")
