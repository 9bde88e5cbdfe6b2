"""Trainer formats. Each export is written to a temporary file and renamed into place.

Every file and folder an export writes or deletes goes through regen.safe's functions, confined
to the folder the export belongs to (the output directory, or the one `--to` names): a link
there that leads out of it is refused before anything is touched, a deletion never follows a
link, and every text written has the registered keys taken out."""

from __future__ import annotations

import array
import contextlib
import errno
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from regen import failpoints
from regen.conversation import seeded_unit
from regen.errors import StateError
from regen.outputs.audit import Checks, as_ids_hold, rebuilt, sample_problems
from regen.outputs.hub import (
    CARD,
    LICENSE,
    LLAMA_FACTORY_INFO,
    NOT_DATA,
    data_files,
    dataset_card,
    llama_factory_info,
    public_path,
    public_source,
)
from regen.reconstruct import ReconstructError, Sample, Target
from regen.reconstruct.target import billed_prompt
from regen.safe import (
    checked_name,
    confined,
    confined_tree,
    create,
    make_dirs,
    redact_values,
    remove,
    root_for,
    within,
    write_text_atomic,
)
from regen.state.answers import ExportRow, pack_ids, unpack_ids
from regen.state.db import Store


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
    history = row.history()
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


@dataclass(frozen=True)
class Origins:
    """What every answer's provenance shares with its dataset: the source it was read from and
    the mode its turns were chosen by."""

    sources: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, store: Store, datasets: Iterable[str]) -> Origins:
        modes = {n: m for n in datasets if (m := store.sources.mode(n)) is not None}
        return cls({n: public_source(store.sources.source(n)) for n in datasets}, modes)


def history_author(row: ExportRow) -> str:
    """Who wrote the assistant turns of an answer's history: `none` (it has none), `target`
    (sequential mode: every one is a regenerated answer) or `source` (the dataset's own)."""
    turns = [t for t, m in enumerate(row.history()) if m.get("role") == "assistant"]
    if not turns:
        return "none"
    if row.regenerated and all(t in row.regenerated for t in turns):
        return "target"
    return "source"


def provenance(
    row: ExportRow, dataset: str, origins: Origins, token_ids: str | None = None
) -> dict[str, Any]:
    """Where an answer came from, flat (one value a field, so every reader types it): its
    source row (file, number from 0, the row's own id), the mode and turn it answers, who
    answered (model, provider, the job's endpoint, run, generation id), the settings its
    request carried (JSON text), its bill and how it ended, and its token ids: `exact` (the
    server returned them), `reconstructed` (the tokenized export rebuilt them from the
    template) or `none` (a text export of an answer without server ids)."""
    if token_ids is None:
        token_ids = "exact" if row.completion_token_ids is not None else "none"
    return {
        "dataset": dataset,
        "source_file": origins.sources.get(dataset),
        "source_row": row.row_index,
        "source_id": row.source_id,
        "mode": origins.modes.get(dataset),
        "turn_index": row.turn_index,
        "sample": row.sample,
        "history": history_author(row),
        "item_id": row.item_id,
        "model": row.model,
        "provider": row.provider,
        "endpoint": row.endpoint,
        "run_id": row.run_id,
        "generation_id": row.generation_id,
        "settings": row.settings,
        "finish_reason": row.finish_reason,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "reasoning_tokens": row.reasoning_tokens,
        "cost_usd": row.cost_usd,
        "usage_source": row.usage_source or "server",
        "token_ids": token_ids,
    }


def write_jsonl_atomic(
    path: Path, records: Iterable[dict[str, Any]], root: Path | None = None
) -> int:
    """Write records as JSONL to `path` via a temporary file and a rename; return the count.
    `root`: the folder the file is confined to (`path`'s own by default)."""
    root = path.parent if root is None else root
    confined(root, path)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    try:
        make_dirs(root, path.parent)
        with create(root, tmp) as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False))
                f.write("\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        failpoints.reached("export")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            remove(root, tmp)
        raise StateError(
            f"{path}: cannot write export: {exc}; every result is kept in state.db, so run the "
            "same command again once the problem is fixed"
        ) from exc
    return n


def clean_stale_exports(
    export_dir: Path, folder: str | None = None, root: Path | None = None
) -> list[str]:
    """Remove what a killed export left behind: `.NAME.jsonl.tmp` files of a run's export (a
    run holds the directory's lock, so none is being written), and `.FORMAT.tmp-PID` /
    `.FORMAT.old-PID` folders of `regen export` processes that no longer run. Returns what
    was removed. An `.old-PID` folder is put back when its export's folder is missing.
    `folder`: only the leftovers of `regen export` into that folder (a run may be writing its
    own files beside them). `root`: the folder this is confined to (`export_dir`'s parent by
    default). A link is never a leftover (regen makes none): it is left alone."""
    root = export_dir.parent if root is None else root
    removed: list[str] = []
    if not confined(root, export_dir).is_dir():
        return removed
    for p in export_dir.iterdir():
        name = p.name
        if p.is_symlink() or (folder is not None and not name.startswith(f".{folder}.")):
            continue  # `regen export` cleans its own folder's leftovers only
        if folder is None and p.is_file() and name.startswith(".") and name.endswith(".jsonl.tmp"):
            remove(root, p)
            removed.append(name)
            continue
        m = re.fullmatch(r"\.(.+)\.(tmp|old)-(\d+)", name)
        if not (p.is_dir() and m) or _alive(int(m[3])):
            continue
        target = export_dir / m[1]
        if m[2] == "old" and not target.is_symlink() and not target.exists():
            os.rename(p, confined(root, target))  # the swap was cut between its two renames
            removed.append(f"{name} (put back as {m[1]})")
        else:
            with contextlib.suppress(OSError):
                remove(root, p)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def export_specforge(
    store: Store, datasets: list[str], export_dir: Path
) -> tuple[dict[str, int], dict[str, int]]:
    """`<export_dir>/<dataset>.jsonl` for each dataset; returns the samples written and those
    left out (their history holds the dataset's own assistant turns, which SpecForge would
    train on: `regen export` writes them with exact loss masks), per dataset. Answers to rows
    no longer in a dataset's source are left out too (the run's summary counts them)."""
    written: dict[str, int] = {}
    left_out: Counter[str] = Counter()
    origins = Origins.of(store, datasets)
    root = root_for(export_dir, store.path.parent)

    def records(name: str) -> Iterable[dict[str, Any]]:
        # `regen export --format specforge` without ids: the one rule for what carries loss.
        for r in store.answers.export_rows(name):
            if _drop_reason(r, RUN_EXPORT) == "orphan":
                continue
            rec, _ = _record(r, name, None, RUN_EXPORT, origins)
            if rec is None:
                left_out[name] += 1  # source_history, the only reason without ids or filters
                continue
            yield rec

    paths = [export_dir / f"{checked_name(n, str(store.path))}.jsonl" for n in datasets]
    for path in paths:  # every file checked before the first is written
        confined(root, path)
    for name, path in zip(datasets, paths, strict=True):
        written[name] = write_jsonl_atomic(path, records(name), root)
    return written, dict(left_out)


# --- `regen export`: formats, filters, mixes, splits, manifest ---------------------------------

FORMATS = ("specforge", "openai", "sharegpt", "tokenized")
TEXT_FORMATS = ("openai", "sharegpt")
"""Formats that never hold token ids."""
SPLITS = ("train", "validation")


def openai_record(row: ExportRow) -> dict[str, Any]:
    """`{"id", "messages": [{"role", "content", "reasoning_content"?, "tool_calls"?,
    "weight"?, ...}], "tools"?}`: the SpecForge record under the name OpenAI-style trainers
    read. Every assistant message carries OpenAI fine-tuning's `weight`: 1 where the target
    wrote it, 0 for the dataset's own turns (context, no loss)."""
    rec = specforge_record(row)
    messages = rec["conversations"]
    regenerated = row.regenerated or {}
    for t, m in enumerate(messages):
        if m["role"] == "assistant":
            m["weight"] = 1 if t == len(messages) - 1 or t in regenerated else 0
    out: dict[str, Any] = {"id": rec["id"], "messages": messages}
    if "tools" in rec:
        out["tools"] = rec["tools"]
    return out


SOURCE_TURNS = {
    "specforge": "written with `input_ids` and `loss_mask` (SpecForge reads a file whose first "
    "record has both as pre-tokenized: the loss covers the target's answer only) when the "
    "export has the target's ids (--family, or the job's [reconstruct]); else the sample is "
    "left out (`source_history`)",
    "openai": "kept, with `weight: 0` on the dataset's own assistant turns (OpenAI fine-tuning's "
    "per-message flag)",
    "sharegpt": "left out (`source_history`): LLaMA-Factory has no per-message flag and trains "
    "every gpt turn unless mask_history is on",
    "tokenized": "kept: the loss mask covers the target's answer only",
}
"""What the default export does with a sample whose history holds the dataset's own assistant
turns (history `source`), per format; --train-source-turns writes them as plain turns."""


def source_turns(opts: ExportOptions) -> str:
    """What this export did with samples whose history holds the dataset's own turns."""
    if not opts.train_source_turns:
        return SOURCE_TURNS[opts.format]
    return (
        "written with those turns as plain assistant turns (--train-source-turns): trainers "
        "train on them unless their last-turn switch is on (SpecForge "
        "`data.train_only_last_turn=true`, LLaMA-Factory `mask_history: true`)"
    )


SHAREGPT_FROM = {"user": "human", "assistant": "gpt", "system": "system", "tool": "observation"}
TOOL_RESULTS_JOIN = "\n</tool_response>\n<tool_response>\n"
"""How LLaMA-Factory's own OpenAI converter puts several tool results in one observation."""


class Unwritable(ValueError):
    """A sample the format cannot hold as it is (its reason is counted as dropped)."""


def _sharegpt_call_turn(m: dict[str, Any]) -> str:
    """An assistant turn with calls as LLaMA-Factory's `function_call` value: the calls as
    JSON (`{"name", "arguments": {...}}`, a list for several), arguments as objects, after
    the reasoning in `<think>` tags. Text beside the calls has no place in it."""
    if m.get("content"):
        raise Unwritable("content_with_calls")
    calls = []
    for tc in m["tool_calls"]:
        fn = tc.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            raise Unwritable("arguments_not_json") from None
        if not isinstance(args, dict):
            raise Unwritable("arguments_not_json")
        calls.append({"name": fn.get("name"), "arguments": args})
    value = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
    if m.get("reasoning_content"):
        value = f"<think>\n{m['reasoning_content']}\n</think>\n\n{value}"
    return value


def as_template_shows(row: ExportRow, target: Target) -> ExportRow:
    """The row with the reasoning of earlier assistant turns that the model's own template does
    not show (Qwen3's drops it before the last question) taken out of its history: a trainer
    that renders the history as text would otherwise learn it as the target's. The row as it
    is when its history holds no reasoning, or the template cannot render it."""
    history = row.history()
    if not any(m.get("role") == "assistant" and m.get("reasoning") for m in history):
        return row
    try:
        rendered = target.prompt_text(history, row.conversation.get("tools"))
    except Exception:  # noqa: BLE001 - a template that cannot render it: nothing is taken out
        return row
    hidden = [
        i
        for i, m in enumerate(history)
        if m.get("role") == "assistant" and m.get("reasoning") and m["reasoning"] not in rendered
    ]
    if not hidden:
        return row
    # Each turn is changed where it comes from: a regenerated turn among the regenerated, the
    # dataset's own in the conversation, so that who wrote the history (history_author) stays.
    regenerated = dict(row.regenerated or {})
    messages = list(row.conversation["messages"])
    for i in hidden:
        if i in regenerated:
            regenerated[i] = {**regenerated[i], "reasoning": None}
        else:
            messages[i] = {**messages[i], "reasoning": None}
    conversation = {**row.conversation, "messages": messages}
    return replace(row, regenerated=regenerated or None, conversation=conversation)


def sharegpt_record(row: ExportRow) -> dict[str, Any]:
    """`{"id", "conversations": [{"from", "value"}], "system", "tools"}` as LLaMA-Factory's
    sharegpt converter reads it: turns alternate (human or observation, then gpt or
    function_call); an assistant turn with calls is one `function_call` turn (see
    _sharegpt_call_turn); the results of parallel calls are one `observation`; reasoning goes
    inline as `<think>...</think>` before the answer (the format has no field for it); `tools`
    is a JSON string. Raises Unwritable for what the format cannot hold."""
    turns: list[dict[str, str]] = []
    system = None
    for m in specforge_record(row)["conversations"]:
        if m["role"] == "system":
            if turns or system is not None:
                raise Unwritable("system_not_first")
            system = m["content"]
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            turns.append({"from": "function_call", "value": _sharegpt_call_turn(m)})
        elif m["role"] == "assistant":
            text = m.get("content") or ""
            if m.get("reasoning_content"):
                text = f"<think>\n{m['reasoning_content']}\n</think>\n\n{text}"
            turns.append({"from": "gpt", "value": text})
        elif m["role"] == "tool" and turns and turns[-1]["from"] == "observation":
            turns[-1]["value"] += TOOL_RESULTS_JOIN + (m.get("content") or "")
        else:
            turns.append({"from": SHAREGPT_FROM[m["role"]], "value": m.get("content") or ""})
    for k, t in enumerate(turns):
        if (t["from"] in ("gpt", "function_call")) != (k % 2 == 1):
            raise Unwritable("turns_do_not_alternate")
    # system and tools are on every row: LLaMA-Factory's loader fails on a column its
    # dataset_info.json maps that no row of a file has ("" is none to it).
    out: dict[str, Any] = {"id": row.item_id, "conversations": turns, "system": system or ""}
    tools = row.conversation.get("tools")
    out["tools"] = json.dumps(tools, ensure_ascii=False) if tools else ""
    return out


RECORDS: dict[str, Callable[[ExportRow], dict[str, Any]]] = {
    "specforge": specforge_record,
    "openai": openai_record,
    "sharegpt": sharegpt_record,
}


@dataclass(frozen=True)
class ExportOptions:
    """What `regen export` writes and what it leaves out (all recorded in the manifest)."""

    format: str = "specforge"
    keep_truncated: bool = False
    """Answers cut at max_tokens (`finish_reason == "length"`) are dropped unless kept."""
    keep_empty: bool = False
    min_completion_tokens: int | None = None
    max_completion_tokens: int | None = None
    exclude_providers: tuple[str, ...] = ()
    weights: dict[str, float] = field(default_factory=dict)
    """Per dataset: each sample is written floor(w) times, plus once more with probability
    w - floor(w) (seeded): 0.5 keeps about half, 2 doubles."""
    caps: dict[str, int] = field(default_factory=dict)
    """Per dataset: at most this many samples (after the weight), the first in source order."""
    validation_fraction: float = 0.0
    """Conversations (all their turns together) put in the validation split, by seeded hash."""
    seed: int = 0
    dedup: bool = False
    """Drop samples whose conversation (history and answer) an earlier one already had."""
    since_last: bool = False
    """Only answers stored after the previous export to the same folder, as a new part."""
    shard_rows: int = 100_000
    """Tokenized: rows per Parquet file."""
    drop_failed_audit: bool = False
    """Drop samples that fail `regen audit`'s checks (structure, length against the bill)."""
    max_sample_diff: int = 3
    """With drop_failed_audit: the largest rebuilt-minus-billed completion difference kept."""
    samples: str = "all"
    """`all` the samples of each prompt, or `first`: the first of them that passes the filters
    (for trainers that want one answer per prompt)."""
    train_source_turns: bool = False
    """Write the dataset's own assistant turns of an answer's history as ordinary assistant
    turns, which trainers train on unless their last-turn switch is on (SpecForge
    `data.train_only_last_turn`, LLaMA-Factory `mask_history`). Off: they carry no loss in
    any trainer's defaults (SOURCE_TURNS says how, per format)."""
    keep_orphans: bool = False
    """Also write answers to rows (or turns) their dataset's source no longer has, as last
    read in full (ExportRow.orphan): left out by default, counted as dropped `orphan`."""
    license: str = "unknown"
    """The card's licence, a Hub licence id: regen cannot know it (the sources' licences and
    the target's terms decide it), so `unknown` unless given."""


RUN_EXPORT = ExportOptions(format="specforge")
"""What the run's own export writes (export_specforge): SpecForge records, no filters."""


def _drop_reason(row: ExportRow, opts: ExportOptions) -> str | None:
    if row.orphan and not opts.keep_orphans:
        return "orphan"
    if row.finish_reason == "length" and not opts.keep_truncated:
        return "truncated"
    if not (row.content or row.reasoning or row.tool_calls) and not opts.keep_empty:
        return "empty"
    if row.provider is not None and row.provider in opts.exclude_providers:
        return "excluded_provider"
    if (
        opts.min_completion_tokens is not None
        and row.completion_tokens < opts.min_completion_tokens
    ):
        return "below_min_tokens"
    if (
        opts.max_completion_tokens is not None
        and row.completion_tokens > opts.max_completion_tokens
    ):
        return "above_max_tokens"
    return None


@dataclass
class _Counts:
    samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    dropped: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    """Tokenized samples written, by where their ids came from: exact or reconstructed."""
    reasoning_in_field: int = 0
    """SpecForge records without ids whose reasoning is only in `reasoning_content`."""
    reasoning_tokens: int = 0
    """... and the reasoning tokens billed for their answers."""
    truncated: int = 0
    """Answers cut at max_tokens written (`--keep-truncated`)..."""
    truncated_checked: int = 0
    """... of them rebuilt and found whole by the self-check (a target was given)."""
    text_from_ids: int = 0
    """Samples written with the text their exact ids hold, not the server's (as_ids_hold)."""


class _JsonlShards:
    """One JSONL file per (split, dataset), opened on first use in a temporary folder."""

    def __init__(self, tmp: Path, suffix: str) -> None:
        self._tmp, self._suffix = tmp, suffix
        self._files: dict[tuple[str, str], Any] = {}
        self.written: dict[str, dict[str, list[str]]] = {}
        """The files written, by dataset and split (relative paths): what the card lists."""

    def write(self, split: str, dataset: str, rec: dict[str, Any]) -> None:
        key = (split, dataset)
        if key not in self._files:
            path = self._tmp / split / f"{dataset}{self._suffix}.jsonl"
            self.written.setdefault(dataset, {}).setdefault(split, []).append(
                f"{split}/{path.name}"
            )
            make_dirs(self._tmp, path.parent)
            self._files[key] = create(self._tmp, path)
        f = self._files[key]
        f.write(json.dumps(rec, ensure_ascii=False))
        f.write("\n")

    def close(self) -> None:
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()


class _ParquetShards:
    """Tokenized rows in Parquet files of at most `shard_rows` rows per (split, dataset)."""

    def __init__(self, tmp: Path, suffix: str, shard_rows: int) -> None:
        self._tmp, self._suffix, self._shard_rows = tmp, suffix, shard_rows
        self._rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._shards: Counter[tuple[str, str]] = Counter()
        self.written: dict[str, dict[str, list[str]]] = {}
        """The files written, by dataset and split (relative paths): what the card lists."""

    def write(self, split: str, dataset: str, rec: dict[str, Any]) -> None:
        rows = self._rows.setdefault((split, dataset), [])
        rows.append(redact_values(rec))  # Parquet takes values, not text: keys out of each
        if len(rows) >= self._shard_rows:
            self._flush(split, dataset)

    def _flush(self, split: str, dataset: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = self._rows.pop((split, dataset), [])
        if not rows:
            return
        n = self._shards[(split, dataset)]
        self._shards[(split, dataset)] += 1
        path = self._tmp / split / f"{dataset}{self._suffix}-{n:05d}.parquet"
        self.written.setdefault(dataset, {}).setdefault(split, []).append(f"{split}/{path.name}")
        make_dirs(self._tmp, path.parent)
        remove(self._tmp, path)  # pyarrow opens the path as it is: nothing may be there
        # The ids arrive as the stored little-endian uint32 bytes: the columns are built from
        # one buffer each, not from Python lists (ten times faster for long samples).
        ids = b"".join(r["input_ids"] for r in rows)
        mask = b"".join(r["loss_mask"] for r in rows)
        if sys.byteorder == "big":
            swapped = array.array("I", ids)
            swapped.byteswap()
            ids = swapped.tobytes()
        offsets = [0]
        for r in rows:
            offsets.append(offsets[-1] + len(r["loss_mask"]))
        offset_array = pa.array(offsets, pa.int32())
        id_values = pa.Array.from_buffers(pa.int32(), len(mask), [None, pa.py_buffer(ids)])
        mask_values = pa.Array.from_buffers(pa.int8(), len(mask), [None, pa.py_buffer(mask)])
        columns = [
            pa.array([r["id"] for r in rows], pa.string()),
            pa.array([r["dataset"] for r in rows], pa.string()),
            pa.ListArray.from_arrays(offset_array, id_values),
            pa.ListArray.from_arrays(offset_array, mask_values),
            pa.array([r["n_prompt"] for r in rows], pa.int32()),
            pa.array([r["n_completion"] for r in rows], pa.int32()),
            pa.array([r["source"] for r in rows], pa.string()),
            pa.array([r["prompt_diff"] for r in rows], pa.int32()),
            pa.array([r["completion_diff"] for r in rows], pa.int32()),
            *(
                pa.array([r["provenance"][name] for r in rows], kind)
                for name, kind in PROVENANCE_COLUMNS(pa)
                if name != "dataset"
            ),
        ]
        pq.write_table(pa.Table.from_arrays(columns, schema=TOKENIZED_SCHEMA()), path)

    def close(self) -> None:
        for split, dataset in list(self._rows):
            self._flush(split, dataset)


def TOKENIZED_SCHEMA() -> Any:  # noqa: N802 - a constant, built late (pyarrow loads slowly)
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("dataset", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("n_prompt", pa.int32()),
            ("n_completion", pa.int32()),
            ("source", pa.string()),
            # Rebuilt (or exact) minus billed tokens: 0 when the ids match the provider's count.
            ("prompt_diff", pa.int32()),
            ("completion_diff", pa.int32()),
            # provenance(): where the answer came from.
            *((name, kind) for name, kind in PROVENANCE_COLUMNS(pa) if name != "dataset"),
        ]
    )


def PROVENANCE_COLUMNS(pa: Any) -> list[tuple[str, Any]]:  # noqa: N802 - a constant
    """provenance()'s fields as Parquet columns."""
    text, i32, i64 = pa.string(), pa.int32(), pa.int64()
    return [
        ("dataset", text),
        ("source_file", text),
        ("source_row", i64),
        ("source_id", text),
        ("mode", text),
        ("turn_index", i32),
        ("sample", i32),
        ("history", text),
        ("item_id", text),
        ("model", text),
        ("provider", text),
        ("endpoint", text),
        ("run_id", i64),
        ("generation_id", text),
        ("settings", text),
        ("finish_reason", text),
        ("prompt_tokens", i64),
        ("completion_tokens", i64),
        ("reasoning_tokens", i64),
        ("cost_usd", pa.float64()),
        ("usage_source", text),
        ("token_ids", text),
    ]


def tokenized_record(
    row: ExportRow,
    dataset: str,
    sample: Sample | ReconstructError | None,
    origins: Origins | None = None,
) -> dict[str, Any] | str:
    """input_ids = prompt ids + completion ids, loss_mask 0 over the prompt and 1 over the
    answer; the ids exact where the server returned them, else rebuilt. Returns the reason
    when there are none."""
    if isinstance(sample, ReconstructError):
        return "reconstruct_error"
    if sample is not None and sample.source != "exact" and sample.lost is not None:
        return "rebuild_loses_text"  # the self-check: these ids are not the answer's
    if sample is None:  # no target: only exact ids can be written
        if row.prompt_token_ids is None or row.completion_token_ids is None:
            raise StateError(
                f"answer {row.item_id} ({dataset}) has no exact token ids: give --family "
                "(or a [reconstruct] section in the job) to rebuild them"
            )
        prompt, completion = row.prompt_token_ids, row.completion_token_ids
        source = "exact"
    else:
        prompt, completion = pack_ids(sample.prompt_ids), pack_ids(sample.completion_ids)
        source = sample.source
    n_prompt, n_completion = len(prompt) // 4, len(completion) // 4
    return {
        "id": row.item_id,
        "dataset": dataset,
        "input_ids": prompt + completion,  # uint32 little-endian bytes, joined
        "loss_mask": b"\x00" * n_prompt + b"\x01" * n_completion,
        "n_prompt": n_prompt,
        "n_completion": n_completion,
        "source": source,
        "prompt_diff": n_prompt - billed_prompt(row, n_prompt),
        "completion_diff": n_completion - row.completion_tokens,
        "provenance": provenance(row, dataset, origins or Origins(), source),
    }


def _previous_manifest(to: Path) -> dict[str, Any] | None:
    path = to / "manifest.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: cannot read the previous export's manifest: {exc}") from exc
    return data if isinstance(data, dict) else None


def refuse_replacing(to: Path, out_dir: Path) -> None:
    """An export replaces its folder whole, so the folder must be one an export wrote (it has
    its manifest.json), an empty one or a new one: never the output directory or a folder
    that holds it, never a folder of someone's own files."""
    if within(out_dir, to):
        raise StateError(
            f"{to}: holds the job's output directory {out_dir}, which an export into it would "
            "replace; nothing was touched: give --to a folder of its own (by default "
            "OUT/export/FORMAT)"
        )
    if to.is_dir() and not (to / "manifest.json").is_file() and any(to.iterdir()):
        raise StateError(
            f"{to}: holds files that are not a regen export (it has no manifest.json), and an "
            "export replaces its whole folder; nothing was touched: give --to a new or empty "
            "folder"
        )


def export_job(
    store: Store,
    datasets: list[str],
    to: Path,
    opts: ExportOptions,
    target: Target | None = None,
    checks: Checks | None = None,
) -> dict[str, Any]:
    """Write the export into `to` and return its manifest. Files are written into a temporary
    folder and moved into place only when all are complete; the manifest goes last. `target`
    rebuilds ids (needed by `tokenized` for answers without exact ids, and by the audit
    filter)."""
    _check_options(opts, target, checks)
    for name in datasets:
        checked_name(name, str(store.path))
    root = root_for(to, store.path.parent)
    confined_tree(root, to)  # before anything is read from it, carried over or deleted
    refuse_replacing(to, store.path.parent)
    part = _part(to, opts)
    # The whole export is written into a sibling folder, then swapped in with two renames:
    # a reader sees the old export or the new one, never a mix. Earlier parts of an
    # incremental export are carried over as hard links (no copy).
    tmp = confined(root, to.parent / f".{to.name}.tmp-{os.getpid()}")
    old = confined(root, to.parent / f".{to.name}.old-{os.getpid()}")
    try:
        _fresh_folder(root, to, tmp, carry=opts.since_last)
        manifest = _write_export(store, datasets, tmp, opts, part, target, checks)
        _swap_in(root, to, tmp, old)
    except OSError as exc:
        raise _unwritable(to, old, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            remove(root, tmp)
    return manifest


def _check_options(opts: ExportOptions, target: Target | None, checks: Checks | None) -> None:
    """Refuse options no export can follow, before anything is read or written."""
    if opts.drop_failed_audit and (target is None or checks is None):
        raise StateError("dropping failed-audit samples needs a template family: give --family")
    if opts.format not in FORMATS:
        raise StateError(f"unknown export format {opts.format!r} (allowed: {', '.join(FORMATS)})")
    if not LICENSE.fullmatch(opts.license):
        raise StateError(
            f"--license takes a Hub licence id (apache-2.0, cc-by-4.0, other, ...), not "
            f"{opts.license!r}"
        )


@dataclass(frozen=True)
class _Part:
    """Which part of its folder an export is: 0, the whole export, or with --since-last the
    one after the previous manifest's, of the answers stored after `since`."""

    previous: dict[str, Any] | None
    """The folder's previous manifest, if it has one."""
    since: float | None = None
    number: int = 0

    @property
    def suffix(self) -> str:
        """What the part's data file names carry (none on a first part)."""
        return f".part{self.number:04d}" if self.number else ""


def _part(to: Path, opts: ExportOptions) -> _Part:
    """The part this export writes into `to`; --since-last needs an earlier export of the
    same format there to continue from."""
    previous = _previous_manifest(to)
    if not opts.since_last:
        return _Part(previous)
    if previous is None or previous.get("format") != opts.format:
        raise StateError(
            f"{to}: no earlier {opts.format} export here to continue from; run the export "
            "once without --since-last"
        )
    since = float(previous.get("exported_until") or 0.0)
    return _Part(previous, since, int(previous.get("part", 0)) + 1)


def _fresh_folder(root: Path, to: Path, tmp: Path, *, carry: bool) -> None:
    """An empty temporary folder `tmp` for the export, once what a killed export into `to`
    left is cleaned away; with `carry`, the earlier parts' files linked into it."""
    clean_stale_exports(to.parent, to.name, root)
    remove(root, tmp)
    make_dirs(root, tmp.parent)
    tmp.mkdir()
    if carry:
        for f in to.rglob("*"):  # rglob does not descend into linked folders
            if f.is_file() and not f.is_symlink() and f.name not in NOT_DATA:
                dest = tmp / f.relative_to(to)
                make_dirs(tmp, dest.parent)
                os.link(f, dest)


def _write_export(
    store: Store,
    datasets: list[str],
    tmp: Path,
    opts: ExportOptions,
    part: _Part,
    target: Target | None,
    checks: Checks | None,
) -> dict[str, Any]:
    """Write the data files, the card, LLaMA-Factory's dataset_info.json (sharegpt) and
    last the manifest into `tmp`; return the manifest."""
    w = _writing(store, datasets, tmp, opts, part, target, checks)
    until = part.since or 0.0
    for name in datasets:
        until = max(until, _export_dataset(store, name, w))
    w.writer.close()
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    previous = part.previous if opts.since_last else None
    written = _carried(previous, files, w.writer.written)
    manifest = _manifest(
        store, opts, w.counts, files, until, part.since, part.number, part.previous, target
    )
    manifest["data_files"] = written
    # The folder is a Hub dataset: its card names each dataset's files per split.
    card = dataset_card(store, manifest, datasets, source_turns(opts))
    write_text_atomic(tmp, tmp / CARD, card)
    if opts.format == "sharegpt":
        info = llama_factory_info(datasets, files, written)
        write_json_atomic(tmp, tmp / LLAMA_FACTORY_INFO, info)
    write_json_atomic(tmp, tmp / "manifest.json", manifest)
    return manifest


def _writing(
    store: Store,
    datasets: list[str],
    tmp: Path,
    opts: ExportOptions,
    part: _Part,
    target: Target | None,
    checks: Checks | None,
) -> _Writing:
    """The files, origins and targets the datasets are written with."""
    writer: _JsonlShards | _ParquetShards = (
        _ParquetShards(tmp, part.suffix, opts.shard_rows)
        if opts.format == "tokenized"
        else _JsonlShards(tmp, part.suffix)
    )
    origins = Origins.of(store, datasets)
    # Text formats hold no ids: the target is rebuilt only to check answers (to drop
    # failed samples, or cut answers kept). It also decides which of the history's
    # reasoning every format with text keeps (what the model's template shows), and every
    # format's text is what exact ids hold.
    checking = opts.drop_failed_audit or opts.keep_truncated
    return _Writing(
        opts,
        writer,
        origins,
        part.since,
        rebuild=target if opts.format not in TEXT_FORMATS or checking else None,
        checks=checks,
        shown=target if opts.format != "tokenized" else None,
        model=target,
    )


def _swap_in(root: Path, to: Path, tmp: Path, old: Path) -> None:
    """Put the finished export in `to`'s place with two renames; the previous one is removed
    after."""
    if to.is_symlink() or to.exists():
        os.rename(to, old)
        failpoints.reached("export-swap")
    os.rename(tmp, to)
    with contextlib.suppress(OSError):
        remove(root, old)


def _unwritable(to: Path, old: Path, exc: OSError) -> StateError:
    """The error of an export that could not be written, once the previous export is back
    in its place: the next step depends on whether the folder can be written at all."""
    if old.exists() and not to.exists():
        os.rename(old, to)  # put the previous export back
    step = (
        "write it elsewhere with --to DIR"
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        else "run it again once the problem is fixed"
    )
    return StateError(
        f"{to}: cannot write the export: {exc}; the previous export and state.db are "
        f"untouched: {step}"
    )


@dataclass
class _Writing:
    """What every dataset of one export is written with: the options, the files, the counts
    so far, the hashes dedup has seen, and the targets each step uses."""

    opts: ExportOptions
    writer: _JsonlShards | _ParquetShards
    origins: Origins
    since: float | None
    rebuild: Target | None = None
    """Rebuilds ids (tokenized answers without exact ids, the audit filter)."""
    checks: Checks | None = None
    shown: Target | None = None
    """The model whose template decides which earlier turns' reasoning a history keeps."""
    model: Target | None = None
    """The model whose parser reads an answer's exact ids back as text (as_ids_hold)."""
    counts: dict[str, _Counts] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)


def _export_dataset(store: Store, name: str, w: _Writing) -> float:
    """Write one dataset's samples; return the latest answer time seen."""
    opts = w.opts
    c = w.counts.setdefault(name, _Counts())
    weight = opts.weights.get(name, 1.0)
    cap = opts.caps.get(name)
    written = 0
    until = 0.0
    prompts: set[tuple[str, int]] = set()
    for row, sample in _dataset_rows(store, name, w):
        until = max(until, row.created_at)
        prompt = (row.conversation_id, row.turn_index)
        reason = _filtered(row, sample, w, prompt in prompts)
        rec: dict[str, Any] | None = None
        from_ids = False
        if reason is None:
            row, rec, from_ids, reason = _as_record(row, name, sample, w)
        if reason is None and rec is not None and opts.dedup and _seen_before(rec, w):
            reason = "duplicate"
        if reason is not None or rec is None:
            c.dropped[reason or "dropped"] += 1
            continue
        copies = int(weight) + (seeded_unit(opts.seed, "w", row.item_id) < weight % 1)
        if not copies:
            c.dropped["weight"] += 1
            continue
        split = _split(row, opts)
        prompts.add(prompt)
        for _ in range(copies):
            if cap is not None and written >= cap:
                c.dropped["cap"] += 1
                break
            w.writer.write(split, name, rec)
            _count_written(c, opts.format, split, row, rec, sample, from_ids)
            written += 1
    return until


def _dataset_rows(
    store: Store, name: str, w: _Writing
) -> Iterable[tuple[ExportRow, Sample | ReconstructError | None]]:
    """The dataset's answers (after `since`), each with its rebuilt sample when a target
    rebuilds them: answers the filters drop are not rebuilt."""
    if w.rebuild is None:
        return ((row, None) for row in store.answers.export_rows(name, w.since))
    return rebuilt(
        store, name, w.rebuild, w.since, wanted=lambda row: _drop_reason(row, w.opts) is None
    )


def _filtered(
    row: ExportRow, sample: Sample | ReconstructError | None, w: _Writing, answered: bool
) -> str | None:
    """Why the options leave the answer out before it is made a record, or None: the
    filters, a prompt that already has a sample (`--samples first`; `answered`), a failed
    audit (`--drop-failed-audit`)."""
    reason = _drop_reason(row, w.opts)
    if reason is None and w.opts.samples == "first" and answered:
        return "other_sample"
    if (
        reason is None
        and w.opts.drop_failed_audit
        and sample is not None
        and w.rebuild is not None
        and w.checks is not None
        and sample_problems(row, sample, w.rebuild, w.checks).problems_of_the_answer
    ):
        return "failed_audit"
    return reason


def _as_record(
    row: ExportRow, name: str, sample: Sample | ReconstructError | None, w: _Writing
) -> tuple[ExportRow, dict[str, Any] | None, bool, str | None]:
    """The row as written (its text what its exact ids hold, its history's reasoning what
    the template shows), its record or the reason it is left out, and whether its text was
    taken from its ids."""
    from_ids = False
    if w.model is not None and w.opts.format != "tokenized":
        # A record's text is what its ids hold, not text the server put around it.
        held = as_ids_hold(row, w.model, _exact(sample))
        from_ids, row = held is not row, held
    if w.shown is not None:
        row = as_template_shows(row, w.shown)
    rec, reason = _record(row, name, sample, w.opts, w.origins)
    return row, rec, from_ids, reason


def _seen_before(rec: dict[str, Any], w: _Writing) -> bool:
    """Whether an earlier sample had the same conversation and answer (or the same ids),
    whatever its item id; the sample is remembered either way."""
    content = (
        rec["input_ids"]
        if w.opts.format == "tokenized"
        else json.dumps(
            {k: v for k, v in rec.items() if k not in ("id", "provenance")},
            sort_keys=True,
            ensure_ascii=False,
        ).encode()
    )
    key = hashlib.blake2b(content, digest_size=16).hexdigest()
    seen = key in w.seen
    w.seen.add(key)
    return seen


def _split(row: ExportRow, opts: ExportOptions) -> str:
    """The split of the answer's conversation (all its turns together), by seeded hash."""
    if seeded_unit(opts.seed, "split", row.conversation_id) < opts.validation_fraction:
        return "validation"
    return "train"


def _count_written(
    c: _Counts,
    fmt: str,
    split: str,
    row: ExportRow,
    rec: dict[str, Any],
    sample: Sample | ReconstructError | None,
    from_ids: bool,
) -> None:
    """Count one sample written: its split, tokens and cost, where its ids came from, a cut
    answer (and whether the self-check found it whole), reasoning only in its field."""
    if fmt == "tokenized":
        c.sources[rec["source"]] += 1
    if row.finish_reason == "length":
        c.truncated += 1
        c.truncated_checked += isinstance(sample, Sample) and sample.lost is None
    c.text_from_ids += from_ids
    if fmt == "specforge" and reasoning_in_field(rec):
        c.reasoning_in_field += 1
        c.reasoning_tokens += row.reasoning_tokens
    c.samples[split] += 1
    c.prompt_tokens += row.prompt_tokens
    c.completion_tokens += row.completion_tokens
    c.cost_usd += row.cost_usd or 0.0


def _exact(sample: Sample | ReconstructError | None) -> Sample | None:
    """The sample when its ids are the server's."""
    return sample if isinstance(sample, Sample) and sample.source == "exact" else None


def _record(
    row: ExportRow,
    dataset: str,
    sample: Sample | ReconstructError | None,
    opts: ExportOptions,
    origins: Origins,
) -> tuple[dict[str, Any] | None, str | None]:
    """The sample in the export's format, or the reason it is left out. Without
    train_source_turns, a sample whose history holds the dataset's own assistant turns is
    written so that its trainer's defaults leave them without loss (SOURCE_TURNS)."""
    if opts.format == "tokenized":
        made = tokenized_record(row, dataset, sample, origins)
        return (made, None) if isinstance(made, dict) else (None, made)
    with_ids = opts.format == "specforge" and sample is not None and not opts.train_source_turns
    unmarked = opts.format == "sharegpt" or (opts.format == "specforge" and not with_ids)
    if unmarked and not opts.train_source_turns and history_author(row) == "source":
        return None, "source_history"
    try:
        rec = RECORDS[opts.format](row)
    except Unwritable as exc:
        return None, str(exc)
    token_ids = None
    if with_ids:
        made = tokenized_record(row, dataset, sample, origins)
        if isinstance(made, str):
            return None, made
        rec["input_ids"] = unpack_ids(made["input_ids"])
        rec["loss_mask"] = list(made["loss_mask"])
        token_ids = made["source"]
    if opts.format == "openai" and opts.train_source_turns:
        for m in rec["messages"]:
            if m["role"] == "assistant":
                m["weight"] = 1
    rec["provenance"] = provenance(row, dataset, origins, token_ids)
    return rec, None


def _manifest(
    store: Store,
    opts: ExportOptions,
    counts: dict[str, _Counts],
    files: list[str],
    until: float,
    since: float | None,
    part: int,
    previous: dict[str, Any] | None,
    target: Target | None = None,
) -> dict[str, Any]:
    from regen import __version__

    parts = list(previous.get("parts", [])) if previous and opts.since_last else []
    parts.append({"part": part, "since": since, "until": until, "files": files})
    options = asdict(opts)
    return {
        "format": opts.format,
        "regen_version": __version__,
        "fingerprint": store.get_meta("fingerprint"),
        "created_at": time.time(),
        "exported_until": until,
        "part": part,
        "parts": parts,
        "filters": options,
        # Uploaded with the data: a local tokenizer or template by its name, not its path.
        "reconstruct": (
            {k: public_path(v) for k, v in asdict(target.spec).items()}
            if target is not None
            else None
        ),
        "datasets": {
            name: {
                "samples": c.samples,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "cost_usd": round(c.cost_usd, 8),
                "dropped": dict(sorted(c.dropped.items())),
                "ids": dict(sorted(c.sources.items())),
                "truncated": {"kept": c.truncated, "checked_whole": c.truncated_checked},
            }
            for name, c in counts.items()
        },
        "files": files,
        "notes": trainer_notes(opts.format, counts),
        "totals": _totals(previous if opts.since_last else None, counts),
    }


def _totals(previous: dict[str, Any] | None, counts: dict[str, _Counts]) -> dict[str, Any] | None:
    """What the folder holds over all its parts, per dataset: this part's counts added to the
    previous export's totals (a first part's counts are its totals). None when an earlier
    part's are unknown (written before regen kept them)."""
    earlier: dict[str, Any] = {}
    if previous is not None:
        recorded = previous.get("totals")
        if recorded is None and int(previous.get("part", 0)) == 0:
            recorded = previous.get("datasets")
        if not isinstance(recorded, dict):
            return None
        earlier = recorded
    out: dict[str, Any] = {}
    for name in dict.fromkeys([*earlier, *counts]):
        before, c = earlier.get(name, {}), counts.get(name, _Counts())
        samples = before.get("samples", {})
        out[name] = {
            "samples": {k: int(samples.get(k, 0)) + c.samples[k] for k in SPLITS},
            "prompt_tokens": int(before.get("prompt_tokens", 0)) + c.prompt_tokens,
            "completion_tokens": int(before.get("completion_tokens", 0)) + c.completion_tokens,
            "cost_usd": round(float(before.get("cost_usd", 0.0)) + c.cost_usd, 8),
        }
    return out


SPECFORGE_THINKING = "`qwen3-thinking`, `kimi-k2-thinking`, `deepseek-r1-distill`"
"""SpecForge chat templates whose parser (`parser_type` thinking) reads `reasoning_content`."""


def reasoning_in_field(rec: dict[str, Any]) -> bool:
    """Whether a SpecForge record without ids holds reasoning in `reasoning_content`, which
    only SpecForge's thinking parser reads."""
    if "input_ids" in rec:
        return False
    return any(m.get("reasoning_content") for m in rec.get("conversations", ()))


def trainer_notes(fmt: str, counts: dict[str, _Counts]) -> list[str]:
    """What a trainer reading the export with its defaults would lose, and the setting that
    keeps it: said at export and written on the card."""
    notes = truncated_notes(counts) + ids_text_notes(counts)
    samples = sum(c.reasoning_in_field for c in counts.values())
    if fmt != "specforge" or not samples:
        return notes
    tokens = sum(c.reasoning_tokens for c in counts.values())
    return notes + [
        f"specforge: {samples} samples keep their reasoning in `reasoning_content` only "
        f"({tokens:,} reasoning tokens billed); SpecForge's general parser (chat templates such "
        f"as `qwen` or `llama3`) drops it: train with a thinking template ({SPECFORGE_THINKING}) "
        "to keep it, or export with --family to write the exact ids and loss mask"
    ]


def ids_text_notes(counts: dict[str, _Counts]) -> list[str]:
    """How many samples were written with the text their exact ids hold rather than the
    server's, which had text around a field the ids do not hold."""
    n = sum(c.text_from_ids for c in counts.values())
    if not n:
        return []
    return [
        f"export: {n} answer(s) written with the text their token ids hold: the server added "
        "whitespace around a field that its ids do not hold (`regen audit` names them "
        "`server_inserted_text`)"
    ]


def truncated_notes(counts: dict[str, _Counts]) -> list[str]:
    """How many answers cut at max_tokens an export kept, and how many of them the self-check
    rebuilt whole: the others are written as the server sent them, unchecked."""
    kept = sum(c.truncated for c in counts.values())
    if not kept:
        return []
    whole = sum(c.truncated_checked for c in counts.values())
    return [
        f"export: {kept} answer(s) cut at max_tokens kept (--keep-truncated); {whole} of them "
        f"rebuilt and checked whole against the target's template, {kept - whole} not (no "
        "target to check them: give --family or the job's [reconstruct]; or text the "
        "template does not show: `regen audit` names them)"
    ]


def _carried(
    previous: dict[str, Any] | None, files: list[str], written: dict[str, dict[str, list[str]]]
) -> dict[str, dict[str, list[str]]]:
    """The data files of the export by dataset and split: this part's as written, with the
    earlier parts' as their manifest recorded them (read back from their names when it did
    not), each listed only while it is in the folder."""
    present = set(files)
    earlier = previous.get("data_files") if previous else None
    if previous and not isinstance(earlier, dict):
        earlier = data_files(
            sorted(present - {f for s in written.values() for v in s.values() for f in v})
        )
    out: dict[str, dict[str, list[str]]] = {}
    for source in (earlier or {}, written):
        for dataset, splits in source.items():
            for split, paths in splits.items():
                kept = out.setdefault(dataset, {}).setdefault(split, [])
                kept += [p for p in paths if p in present and p not in kept]
    return out


def write_json_atomic(root: Path, path: Path, data: Any) -> None:
    """`data` as indented JSON, written as `write_text_atomic` writes text."""
    write_text_atomic(root, path, json.dumps(data, indent=2, sort_keys=True) + "\n")
