"""Readers: a source (file, folder, saved dataset, hub id) as a stream of rows.

Each reader yields (row_index, row dict) or (row_index, reason) for a row that cannot be used.
Every reader streams: a large file is read in batches, never loaded whole (the JSON-list reader
is the exception the format forces). A source that cannot be opened at all is a SourceError.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from regen.errors import SourceError

Row = tuple[int, dict[str, Any] | str]

HUB_PREFIX = "hf://"
FILE_KINDS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}
BATCH_ROWS = 1024
DEFAULT_MAX_ROW_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where a dataset's rows come from, as [[datasets]] gives it."""

    path: str
    reader: str = "auto"
    config: str | None = None
    split: str | None = None
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES


def read_rows(path: Path | str, reader: str = "auto", **options: Any) -> Iterator[Row]:
    """Rows of a source. `path` is a file, a folder of data files, a dataset saved with
    `datasets.save_to_disk`, or `hf://org/name` (with `config` and `split` options)."""
    spec = SourceSpec(str(path), reader, **options)
    if spec.path.startswith(HUB_PREFIX) or spec.reader == "hf":
        return _read_hub(spec)
    p, kind = _local_kind(spec)
    if kind == "folder":
        return _read_folder(p, spec)
    return _read_file(p, kind, spec)


def _local_kind(spec: SourceSpec) -> tuple[Path, str]:
    """A local source's path and how it is read (`folder` or a file reader)."""
    p = Path(spec.path)
    if not p.exists():
        raise SourceError(f"{p}: no such file or folder")
    kind = spec.reader if spec.reader != "auto" else _guess_kind(p)
    if kind == "folder" or kind == "arrow" and p.is_dir():
        return p, "folder"
    if p.is_dir():
        raise SourceError(f'{p}: is a folder; set reader = "auto" or "folder"')
    return p, kind


def source_files(path: Path | str, reader: str = "auto", **options: Any) -> list[Path] | None:
    """The files a source's rows come from, in the order they are read, or None for a hub id
    (whose rows cannot be fingerprinted)."""
    spec = SourceSpec(str(path), reader, **options)
    if spec.path.startswith(HUB_PREFIX) or spec.reader == "hf":
        return None
    p, kind = _local_kind(spec)
    if kind != "folder":
        return [p]
    return _saved_dataset_files(p, spec) or _data_files(p, spec)


def file_digest(p: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks. CPUs with SHA instructions (x86 SHA-NI,
    ARMv8) hash about 1.4 GB/s with it against 0.8 for blake2b (bench/ingest.py machine)."""
    try:
        with p.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc


def _guess_kind(p: Path) -> str:
    if p.is_dir():
        return "folder"
    kind = FILE_KINDS.get(p.suffix.lower())
    if kind is None:
        raise SourceError(
            f"{p}: cannot tell the file type from '{p.suffix}'; "
            'set reader = "jsonl", "json", "parquet", "csv" or "arrow"'
        )
    return kind


def _read_file(p: Path, kind: str, spec: SourceSpec, offset: int = 0) -> Iterator[Row]:
    readers = {
        "jsonl": _read_jsonl,
        "json": _read_json_list,
        "parquet": _read_parquet,
        "csv": _read_csv,
        "arrow": _read_arrow,
    }
    if kind not in readers:
        raise SourceError(
            f"{p}: unknown reader {kind!r} (allowed: auto, jsonl, json, parquet, csv, arrow, "
            "folder, hf)"
        )
    return readers[kind](p, spec, offset)


def _read_folder(p: Path, spec: SourceSpec) -> Iterator[Row]:
    """A saved dataset (state.json / dataset_dict.json) or a folder of data files, in name
    order; row numbers run on across files."""
    files = _saved_dataset_files(p, spec) or _data_files(p, spec)
    if not files:
        raise SourceError(f"{p}: no data files (.jsonl, .json, .parquet, .csv, .arrow) in it")

    def rows() -> Iterator[Row]:
        offset = 0
        for f in files:
            n = -1
            for n, row in _read_file(f, FILE_KINDS[f.suffix.lower()], spec, offset):
                yield n, row
            offset = max(offset, n + 1)

    return rows()


def _saved_dataset_files(p: Path, spec: SourceSpec) -> list[Path]:
    """The arrow files of a `save_to_disk` folder; a DatasetDict needs a split."""
    if (p / "dataset_dict.json").is_file():
        splits = _json_file(p / "dataset_dict.json").get("splits") or []
        split = spec.split or ("train" if "train" in splits or len(splits) != 1 else splits[0])
        if split not in splits:
            raise SourceError(
                f"{p}: no split {split!r} in the saved dataset (splits: {', '.join(splits)}); "
                "set split ="
            )
        p = p / split
    if not (p / "state.json").is_file():
        return []
    files = _json_file(p / "state.json").get("_data_files") or []
    return [p / f["filename"] for f in files if isinstance(f, dict) and "filename" in f]


def _data_files(p: Path, spec: SourceSpec) -> list[Path]:
    files = sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and f.suffix.lower() in FILE_KINDS
        and not f.name.startswith(".")
        and f.name not in ("dataset_info.json", "state.json")
    )
    if spec.split is not None:
        # Hub layouts name a split by file (`train-00000-of-00002.parquet`) or by folder.
        files = [
            f
            for f in files
            if f.name.startswith(f"{spec.split}-")
            or f.name.startswith(f"{spec.split}.")
            or spec.split in f.relative_to(p).parts[:-1]
        ]
        if not files:
            raise SourceError(f"{p}: no data files for split {spec.split!r}")
    return files


def _json_file(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc
    if not isinstance(data, dict):
        raise SourceError(f"{p}: expected a JSON object")
    return data


def _too_big(size: int, spec: SourceSpec) -> str | None:
    if size > spec.max_row_bytes:
        return f"row is {size / 2**20:.1f} MiB (max_row_bytes is {spec.max_row_bytes / 2**20:.1f})"
    return None


def _read_jsonl(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    try:
        with p.open("rb") as f:
            for i, line in enumerate(f, offset):
                if not line.strip():
                    continue
                big = _too_big(len(line), spec)
                if big:
                    yield i, big
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError:
                    # orjson refuses what json takes (NaN, huge integers, a UTF-8 BOM) and
                    # words its errors otherwise: the json module decides, as it always did.
                    try:
                        row = json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        yield i, f"invalid JSON: {exc}"
                        continue
                yield (i, row) if isinstance(row, dict) else (i, "row is not a JSON object")
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc


def _read_json_list(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    """A JSON array of rows, parsed incrementally (glaive's and ShareGPT's files are single
    arrays of hundreds of MB)."""
    import ijson

    i = offset
    try:
        with p.open("rb") as f:
            head = f.read(4096).lstrip()
            if not head.startswith(b"["):
                kind = "an object" if head.startswith(b"{") else "not a list"
                raise SourceError(f"{p}: expected a JSON list of rows, got {kind}")
            f.seek(0)
            for row in ijson.items(f, "item", use_float=True):
                yield (i, row) if isinstance(row, dict) else (i, "row is not a JSON object")
                i += 1
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        # Past a syntax error an array cannot be resynchronized: the rest of the file is one
        # bad row, reported with the reason, and the rows before it are used.
        yield i, f"invalid JSON here, the rest of the file is not read: {_one_line(exc)}"


def _read_csv(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            for i, row in enumerate(reader, offset):
                if None in row:
                    yield i, "has more fields than the header"
                    continue
                big = _too_big(sum(len(v or "") for v in row.values()), spec)
                yield (i, big) if big else (i, dict(row))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SourceError(f"{p}: cannot read as CSV: {exc}") from exc


def _arrow_rows(batches: Iterator[Any], p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    i = offset
    for batch in batches:
        for row in batch.to_pylist():
            yield i, row
            i += 1


def _read_parquet(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(p)
        yield from _arrow_rows(f.iter_batches(batch_size=BATCH_ROWS), p, spec, offset)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{p}: cannot read as Parquet: {_one_line(exc)}") from exc


def _read_arrow(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    """Arrow IPC, as `save_to_disk` writes it (stream format), or the file format."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(p)) as source:
            try:
                reader: Any = pa.ipc.open_stream(source)
                batches: Iterator[Any] = iter(reader)
            except pa.ArrowInvalid:
                source.seek(0)
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(k) for k in range(reader.num_record_batches))
            yield from _arrow_rows(batches, p, spec, offset)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{p}: cannot read as Arrow: {_one_line(exc)}") from exc


def _read_hub(spec: SourceSpec) -> Iterator[Row]:
    """`hf://org/name`: streamed with the `datasets` library (`pip install 'regen[hub]'`)."""
    name = spec.path.removeprefix(HUB_PREFIX).strip("/")
    try:
        import datasets
    except ImportError as exc:
        raise SourceError(
            f"{spec.path}: reading from the Hugging Face hub needs the datasets package "
            "(pip install 'regen[hub]')"
        ) from exc
    split = spec.split or "train"
    try:
        ds = datasets.load_dataset(name, spec.config, split=split, streaming=True)
        it = iter(ds)
    except Exception as exc:  # the library raises many kinds; each becomes one line
        raise SourceError(
            f"{spec.path} (config {spec.config or 'default'}, split {split}): cannot load from "
            f"the Hugging Face hub: {_one_line(exc)}"
        ) from exc

    def rows() -> Iterator[Row]:
        try:
            yield from enumerate(it)
        except Exception as exc:
            reason = _one_line(exc)
            raise SourceError(f"{spec.path}: reading from the hub failed: {reason}") from exc

    return rows()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
