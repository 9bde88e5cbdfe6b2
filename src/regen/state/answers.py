"""The answers: each done item's result, with its usage and token ids (table `results`)."""

from __future__ import annotations

import array
import json
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from regen.conversation import Message, ToolCall
from regen.state.owner import Owner, Rows
from regen.state.schema import has_column


@overload
def pack_ids(ids: Sequence[int]) -> bytes: ...
@overload
def pack_ids(ids: None) -> None: ...
def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    """Token ids as little-endian uint32 bytes (4 bytes an id, a tenth of their JSON)."""
    if ids is None:
        return None
    arr = array.array("I", ids)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    arr = array.array("I")
    arr.frombytes(blob)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


_EXPORT_COLUMNS = (
    "r.item_id, i.turn_index, c.data, r.content, r.reasoning, r.tool_calls, r.finish_reason, "
    "i.after_item, c.id, r.provider, r.prompt_tokens, r.completion_tokens, r.cost_usd, "
    "r.created_at, r.prompt_token_ids, r.completion_token_ids, c.row_index, c.source_id, "
    "r.model, r.reasoning_tokens, r.usage_source, r.endpoint, r.settings, r.run_id, "
    "r.generation_id, i.sample"
)
"""What an ExportRow is read from (results r, items i, conversations c), and then whether the
item is gone from its dataset's view (_gone_column)."""


@dataclass(frozen=True, slots=True)
class ExportRow:
    """A done item with its conversation, as export needs it."""

    item_id: str
    turn_index: int
    conversation: dict[str, Any]
    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    regenerated: dict[int, dict[str, Any]] | None = None
    """Sequential mode: the regenerated earlier turns (by turn index), as messages."""
    conversation_id: str = ""
    provider: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    created_at: float = 0.0
    prompt_token_ids: bytes | None = None
    completion_token_ids: bytes | None = None
    """Exact ids as stored (store.unpack_ids), when the server returned them."""
    row_index: int = 0
    """The source row's number (from 0, over the source's files in name order)."""
    source_id: str | None = None
    """The source row's own id, where it has one."""
    model: str | None = None
    reasoning_tokens: int = 0
    usage_source: str | None = None
    endpoint: str | None = None
    settings: str | None = None
    """The settings its request carried (canonical JSON), None for answers stored before."""
    run_id: int | None = None
    generation_id: str | None = None
    sample: int = 0
    """Which of its prompt's samples it is."""
    orphan: bool = False
    """Its row (or turn) is no longer in its dataset's source as last read in full: exports
    leave it out unless asked (`--keep-orphans`)."""

    @property
    def exact_prompt_ids(self) -> list[int] | None:
        """The prompt's ids as the server returned them (None: it returned none)."""
        return unpack_ids(self.prompt_token_ids)

    @property
    def exact_completion_ids(self) -> list[int] | None:
        """The completion's ids as the server returned them (None: it returned none)."""
        return unpack_ids(self.completion_token_ids)

    def history(self) -> list[dict[str, Any]]:
        """The messages the request sent: the turns before this one, with sequential mode's
        regenerated answers in place of the original ones."""
        history: list[dict[str, Any]] = self.conversation["messages"][: self.turn_index]
        if self.regenerated:
            history = [self.regenerated.get(i, m) for i, m in enumerate(history)]
        return history


@dataclass(frozen=True, slots=True)
class ResultFact:
    """One answer, as the report reads it (endpoint None: stored before answers named it)."""

    dataset: str
    created_at: float
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float | None
    latency_s: float
    provider: str | None
    finish_reason: str | None
    endpoint: str | None


class Answers(Owner):
    """The `results` table."""

    def _gone_column(self) -> str:
        """`i.gone`, or 0 in a state.db from before m013 (every answer in view)."""
        return "i.gone" if has_column(self._db, "items", "gone") else "0"

    @staticmethod
    def insert_in(db: sqlite3.Connection, results: Rows, *, cache_use: bool = True) -> None:
        """Store answers (outcomes.py's rows) in the open transaction, each with the run that
        stores it (the latest begun: one run holds the directory at a time); `cache_use`: the
        rows end with their cached and written prompt tokens (m015)."""
        db.executemany(
            "INSERT INTO results (item_id, dataset, content, reasoning, tool_calls, "
            "finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, "
            "provider, model, generation_id, latency_s, created_at, prompt_token_ids, "
            "completion_token_ids, usage_source, endpoint, settings, "
            + ("cached_tokens, cache_write_tokens, " if cache_use else "")
            + "run_id) VALUES ("
            + "?," * (22 if cache_use else 20)
            + "(SELECT max(id) FROM runs))",
            results,
        )

    def result_facts(self, endpoint: bool = True) -> Iterator[ResultFact]:
        """Every answer's usage, cost, time on the wire and source, for the report;
        `endpoint=False` for a state.db from before m010_provenance (no endpoint column)."""
        column = "endpoint" if endpoint else "NULL"
        for r in self._db.execute(
            "SELECT dataset, created_at, prompt_tokens, completion_tokens, reasoning_tokens, "
            f"cost_usd, latency_s, provider, finish_reason, {column} FROM results"
        ):
            yield ResultFact(*r)

    def recent_completion_lengths(self, dataset: str, n: int) -> list[int]:
        """The completion tokens of a dataset's latest `n` answers."""
        rows = self._db.execute(
            "SELECT completion_tokens FROM results WHERE dataset = ? ORDER BY rowid DESC LIMIT ?",
            (dataset, n),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def answers_by_provider(self, providers: Sequence[str]) -> dict[str, int]:
        """How many answers each of these provider names served."""
        if not providers:
            return {}
        marks = ",".join("?" * len(providers))
        rows = self._db.execute(
            f"SELECT provider, COUNT(*) FROM results WHERE provider IN ({marks}) GROUP BY provider",
            tuple(providers),
        ).fetchall()
        return {str(p): int(n) for p, n in rows}

    COUNTED = frozenset({"model", "endpoint", "provider", "settings"})
    """What counted_by counts answers by."""

    def counted_by(
        self, column: str, datasets: Sequence[str], orphans: bool = False
    ) -> list[tuple[Any, int]]:
        """The answers of these datasets by a column of COUNTED (value, count), commonest
        first: what made an export (its card). Answers gone from their dataset's view count
        only with `orphans`, as the export writes them only then."""
        if column not in self.COUNTED:
            raise ValueError(f"answers are not counted by {column!r}")
        marks = ",".join("?" * len(datasets))
        kept = "" if orphans else f"AND {self._gone_column()} = 0 "
        rows = self._db.execute(
            f"SELECT r.{column}, COUNT(*) FROM results r JOIN items i ON i.id = r.item_id "
            f"WHERE r.dataset IN ({marks}) {kept}GROUP BY r.{column} ORDER BY COUNT(*) DESC",
            tuple(datasets),
        ).fetchall()
        return [(v, int(n)) for v, n in rows]

    def usage_sources(self) -> dict[tuple[str, str], int]:
        """Answers whose server sent no usage, by (dataset, how they were counted: `ids` or
        `estimate`)."""
        rows = self._db.execute(
            "SELECT dataset, usage_source, COUNT(*) FROM results WHERE usage_source IS NOT NULL "
            "GROUP BY dataset, usage_source"
        ).fetchall()
        return {(d, src): n for d, src, n in rows}

    def export_rows(self, dataset: str, since: float | None = None) -> Iterator[ExportRow]:
        """Done items of a dataset (answered after `since`, if given), in source row order,
        each exactly once, those gone from the dataset's view flagged (ExportRow.orphan)."""
        cur = self._db.execute(
            f"SELECT {_EXPORT_COLUMNS}, {self._gone_column()} FROM results r "
            "JOIN items i ON i.id = r.item_id "
            "JOIN conversations c ON c.id = i.conversation_id "
            "WHERE r.dataset = ? AND r.created_at > ? ORDER BY c.row_index, i.turn_index, i.sample",
            (dataset, -1.0 if since is None else since),
        )
        for r in cur:
            yield self._export_row(r)

    def _export_row(self, r: Sequence[Any]) -> ExportRow:
        regenerated = None
        if r[7] is not None:
            regenerated = {t: m.to_dict() for t, m in self.regenerated_turns(r[8], r[1]).items()}
        return ExportRow(
            item_id=r[0],
            turn_index=r[1],
            conversation=json.loads(r[2]),
            content=r[3],
            reasoning=r[4],
            tool_calls=json.loads(r[5]) if r[5] else [],
            finish_reason=r[6],
            regenerated=regenerated,
            conversation_id=r[8],
            provider=r[9],
            prompt_tokens=r[10],
            completion_tokens=r[11],
            cost_usd=r[12],
            created_at=r[13],
            prompt_token_ids=r[14],
            completion_token_ids=r[15],
            row_index=r[16],
            source_id=r[17],
            model=r[18],
            reasoning_tokens=r[19],
            usage_source=r[20],
            endpoint=r[21],
            settings=r[22],
            run_id=r[23],
            generation_id=r[24],
            sample=r[25],
            orphan=bool(r[26]),
        )

    def results_after(self, rowid: int, limit: int) -> list[tuple[int, str, ExportRow]]:
        """Up to `limit` answers stored after the answer with this rowid, oldest first, as
        (rowid, dataset, row): a cheap cursor over what a run commits."""
        rows = self._db.execute(
            f"SELECT r.rowid, r.dataset, {_EXPORT_COLUMNS}, {self._gone_column()} FROM results r "
            "JOIN items i ON i.id = r.item_id JOIN conversations c ON c.id = i.conversation_id "
            "WHERE r.rowid > ? ORDER BY r.rowid LIMIT ?",
            (rowid, limit),
        ).fetchall()
        return [(r[0], r[1], self._export_row(r[2:])) for r in rows]

    def last_result_rowid(self) -> int:
        row = self._db.execute("SELECT max(rowid) FROM results").fetchone()
        return int(row[0] or 0)

    def regenerated_turns(self, conversation_id: str, before_turn: int) -> dict[int, Message]:
        """The done answers of a conversation's turns before `before_turn`, as assistant
        messages by turn index (what sequential mode sends as history)."""
        rows = self._db.execute(
            "SELECT i.turn_index, r.content, r.reasoning, r.tool_calls FROM items i "
            "JOIN results r ON r.item_id = i.id "
            "WHERE i.conversation_id = ? AND i.turn_index < ?",
            (conversation_id, before_turn),
        ).fetchall()
        return {
            t: Message(
                "assistant",
                content,
                reasoning=reasoning,
                tool_calls=tuple(ToolCall.from_openai(tc) for tc in json.loads(calls or "[]")),
            )
            for t, content, reasoning, calls in rows
        }
