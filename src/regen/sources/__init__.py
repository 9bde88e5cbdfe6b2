"""Prompt sources: readers for files and adapters from their row formats to Conversation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from regen.conversation import BadRow, Conversation
from regen.sources.adapters import ADAPTERS, adapt_row
from regen.sources.readers import read_rows

__all__ = ["ADAPTERS", "adapt_row", "read_conversations", "read_rows"]


def read_conversations(
    dataset: str, path: Path, fmt: str, reader: str = "auto", limit: int | None = None
) -> Iterator[Conversation | BadRow]:
    """Every row of a source as a Conversation, or as a BadRow saying why it is not one."""
    for n, (row_index, row) in enumerate(read_rows(path, reader)):
        if limit is not None and n >= limit:
            return
        if isinstance(row, str):
            yield BadRow(dataset, row_index, row)
        else:
            yield adapt_row(dataset, row_index, row, fmt)
