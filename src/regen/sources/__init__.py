"""Prompt sources: readers for files and adapters from their row formats to Conversation."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from regen.conversation import BadRow, Conversation, Message, seeded_unit
from regen.errors import SourceError
from regen.sources.adapters import (
    ADAPTERS,
    Adapter,
    adapt_row,
    custom_adapter,
    detect_format,
    get_path,
)
from regen.sources.readers import DEFAULT_MAX_ROW_BYTES, read_rows

__all__ = ["ADAPTERS", "Source", "adapt_row", "detect_format", "read_rows"]


def _matches(row: Mapping[str, Any], filters: Mapping[str, Any]) -> bool:
    for path, wanted in filters.items():
        value = get_path(row, path)
        options = wanted if isinstance(wanted, list) else [wanted]
        # Hub columns often hold numbers as strings (OpenCodeInstruct): compare as text too.
        if not any(value == o or str(value) == str(o) for o in options):
            return False
    return True


Pair = tuple[dict[str, Any] | None, Conversation | BadRow]


@dataclass
class Source:
    """One dataset's rows as Conversations (or BadRows), with its selection applied.

    Iterate once; afterwards `rows` counts the rows read, `skipped` those the filter or the
    sample left out, and `format` names the format used (the detected one for `auto`).
    """

    dataset: str
    path: Path | str
    format: str = "openai"
    reader: str = "auto"
    config: str | None = None
    split: str | None = None
    custom: Mapping[str, Any] | None = None
    limit: int | None = None
    filter: Mapping[str, Any] = field(default_factory=dict)
    sample: float | int | None = None
    seed: int = 0
    system: str = "keep"
    system_prompt: str | None = None
    leading_assistant: str = "drop"
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    rows: int = 0
    skipped: int = 0

    def _adapter(self, first: Mapping[str, Any], row_index: int) -> Adapter:
        if self.format == "custom":
            if self.custom is None:
                raise SourceError(f"{self.dataset}: format custom needs a [datasets.custom] table")
            return custom_adapter(self.custom)
        if self.format == "auto":
            found = detect_format(first)
            fields = ", ".join(sorted(first)[:12])
            if not found:
                raise SourceError(
                    f"{self.path}: row {row_index}: cannot tell the format from the fields "
                    f"({fields}); set format = one of {', '.join(ADAPTERS)}, or custom"
                )
            if len(found) > 1:
                raise SourceError(
                    f"{self.path}: row {row_index}: the fields ({fields}) fit formats "
                    f"{' and '.join(found)}; set format = one of them"
                )
            self.format = found[0]
        return ADAPTERS[self.format]

    def _shape(self, conv: Conversation) -> Conversation:
        """The row's conversation with the dataset's system and leading-turn policies."""
        msgs = conv.messages
        # adapt_row leaves a user turn in every conversation; most rows start with it.
        if self.leading_assistant == "drop" and msgs[0].role != "user":
            first_user = next(i for i, m in enumerate(msgs) if m.role == "user")
            head = [m for m in msgs[:first_user] if m.role == "system"]
            if len(head) != first_user:
                msgs = (*head, *msgs[first_user:])
                conv = replace(conv, messages=msgs)
        if self.system == "keep":
            return conv
        has = bool(msgs) and msgs[0].role == "system"
        if self.system == "fill" and has:
            return conv
        rest = msgs[1:] if has else msgs
        if self.system != "drop":
            rest = (Message("system", self.system_prompt or ""), *rest)
        return replace(conv, messages=tuple(rest))

    def _selected(self) -> Iterator[tuple[int, dict[str, Any] | str]]:
        rows = read_rows(
            self.path,
            self.reader,
            config=self.config,
            split=self.split,
            max_row_bytes=self.max_row_bytes,
        )
        for n, (row_index, row) in enumerate(rows):
            if self.limit is not None and n >= self.limit:
                return
            self.rows += 1
            if isinstance(row, dict):
                if self.filter and not _matches(row, self.filter):
                    self.skipped += 1
                    continue
                if (
                    isinstance(self.sample, float)
                    and seeded_unit("sample", self.seed, row_index) >= self.sample
                ):
                    self.skipped += 1
                    continue
            yield row_index, row

    def _sampled(self) -> Iterator[tuple[int, dict[str, Any] | str]]:
        """A count sample: the rows with the smallest seeded draws, kept in row order (memory
        for `sample` rows)."""
        if not isinstance(self.sample, int):
            yield from self._selected()
            return
        heap: list[tuple[float, int, dict[str, Any] | str]] = []
        for row_index, row in self._selected():
            if isinstance(row, str):
                yield row_index, row  # bad rows are reported whatever the sample
                continue
            key = -seeded_unit("sample", self.seed, row_index)
            if len(heap) < self.sample:
                heapq.heappush(heap, (key, row_index, row))
            elif key > heap[0][0]:
                heapq.heapreplace(heap, (key, row_index, row))
                self.skipped += 1
            else:
                self.skipped += 1
        for _, row_index, row in sorted(heap, key=lambda e: e[1]):
            yield row_index, row

    def pairs(
        self, start: int = 0
    ) -> Iterator[tuple[dict[str, Any] | None, Conversation | BadRow]]:
        """Each selected row from row number `start` on, with what it became."""
        adapter: Adapter | None = None
        for row_index, row in self._sampled():
            if row_index < start:
                continue
            if isinstance(row, str):
                yield None, BadRow(self.dataset, row_index, row)
                continue
            if adapter is None:
                adapter = self._adapter(row, row_index)
            conv = adapt_row(self.dataset, row_index, row, adapter)
            yield row, conv if isinstance(conv, BadRow) else self._shape(conv)

    def __iter__(self) -> Iterator[Conversation | BadRow]:
        for _, conv in self.pairs():
            yield conv
