"""Trainer formats. Each export is written to a temporary file and renamed into place."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from regen.errors import StateError
from regen.store import ExportRow, Store


def _specforge_message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("reasoning"):
        out["reasoning_content"] = m["reasoning"]
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name") is not None:
        out["name"] = m["name"]
    return out


def specforge_record(row: ExportRow) -> dict[str, Any]:
    """`{"id", "conversations": [...], "tools"?}` with the regenerated turn in place."""
    history = row.conversation["messages"][: row.turn_index]
    if row.regenerated:
        history = [row.regenerated.get(i, m) for i, m in enumerate(history)]
    turn: dict[str, Any] = {"role": "assistant", "content": row.content}
    if row.reasoning:
        turn["reasoning_content"] = row.reasoning
    if row.tool_calls:
        turn["tool_calls"] = row.tool_calls
    record: dict[str, Any] = {
        "id": row.item_id,
        "conversations": [_specforge_message(m) for m in history] + [turn],
    }
    tools = row.conversation.get("tools")
    if tools:
        record["tools"] = tools
    return record


def write_jsonl_atomic(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as JSONL to `path` via a temporary file and a rename; return the count."""
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False))
                f.write("\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StateError(
            f"{path}: cannot write export: {exc}; every result is kept in state.db, so run the "
            "same command again once the problem is fixed"
        ) from exc
    return n


def export_specforge(store: Store, datasets: list[str], export_dir: Path) -> dict[str, int]:
    """`<export_dir>/<dataset>.jsonl` for each dataset; returns rows written per dataset."""
    return {
        name: write_jsonl_atomic(
            export_dir / f"{name}.jsonl", (specforge_record(r) for r in store.export_rows(name))
        )
        for name in datasets
    }
