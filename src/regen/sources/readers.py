"""Readers: a source (file, folder, saved dataset, hub id) as a stream of rows.

Each reader yields (row_index, row dict) or (row_index, reason) for a row that cannot be used:
whatever a row holds (garbage, invalid UTF-8, NUL bytes, a lone surrogate, nesting thousands of
levels deep, a line of gigabytes), it becomes a reason with its row number and the reading goes
on. Every reader streams: a large file is read in batches, never loaded whole, and a line is
never held longer than max_row_bytes. A source that cannot be opened at all is a SourceError.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
MAX_DEPTH = 128
"""Levels of [ and { a row may nest (the row itself is one). Conversations need a few, tool
schemas a dozen or two; deeper, the code that walks a row (json.dumps, the adapters) could run
out of Python's stack (1,000 frames), so such a row is a bad row."""
SKIP_CHUNK = 2**20
"""Bytes read at a time (at most; no more than max_row_bytes) while the rest of a line longer
than max_row_bytes is thrown away."""
JSON_CHUNK = 64 * 1024
"""Bytes the JSON-list parser reads at a time."""

NOT_OBJECT = "row is not a JSON object"
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels of [ and {{"
LONE_SURROGATE = "text with a lone surrogate (not Unicode)"


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


def _too_big(size: int, spec: SourceSpec, about: bool = False) -> str | None:
    if size > spec.max_row_bytes:
        mib, limit = size / 2**20, spec.max_row_bytes / 2**20
        return f"row is {'about ' if about else ''}{mib:.1f} MiB (max_row_bytes is {limit:.1f})"
    return None


def _lines(f: IO[bytes], limit: int) -> Iterator[bytes | int]:
    """Each line of a binary file (newline included), or, for a line longer than `limit`, its
    size: its bytes are thrown away as they are read, so memory stays about `limit` whatever
    the line's length."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        size = len(line)
        del line
        while True:
            rest = f.readline(min(limit, SKIP_CHUNK))
            size += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield size


def _read_jsonl(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    try:
        with p.open("rb") as f:
            for i, line in enumerate(_lines(f, spec.max_row_bytes), offset):
                if isinstance(line, int):
                    yield i, _too_big(line, spec) or "row is too big"
                    continue
                if not line.strip():
                    continue
                big = _too_big(len(line), spec)
                yield i, big if big else _json_row(line)
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _json_row(line: bytes) -> dict[str, Any] | str:
    """One JSONL line as a row, or the reason it cannot be one."""
    try:
        row = orjson.loads(line)
        lenient = False
    except orjson.JSONDecodeError:
        # orjson refuses what json takes (NaN, huge integers, a UTF-8 BOM, a lone surrogate)
        # and words its errors otherwise: the json module decides, as it always did.
        try:
            row = json.loads(line)
        except RecursionError:
            return TOO_DEEP
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at byte {exc.start})"
        except ValueError as exc:  # JSONDecodeError, or an integer of over 4,300 digits
            return f"invalid JSON: {_one_line(exc)}"
        lenient = True
    if not isinstance(row, dict):
        return NOT_OBJECT
    # Counting brackets is quicker than walking the row, and no row with fewer can nest deeper.
    if line.count(b"[") + line.count(b"{") > MAX_DEPTH and _deeper_than(row, MAX_DEPTH):
        return TOO_DEEP
    if lenient and _SURROGATE_ESCAPE.search(line) and _has_lone_surrogate(row):
        return LONE_SURROGATE
    return row


def _deeper_than(row: Any, limit: int) -> bool:
    """Whether a parsed row nests more than `limit` levels of lists and dicts (without
    recursion, which is what a deep row would exhaust)."""
    stack: list[tuple[Any, int]] = [(row, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _has_lone_surrogate(row: dict[str, Any]) -> bool:
    """JSON may escape half a surrogate pair ("\\ud800"), which json reads and no UTF-8 text
    can hold: such a row could be neither stored nor shown."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _Counted:
    """A binary file that counts the bytes read from it (what the JSON-list reader measures
    its rows by)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self.read_bytes += len(data)
        return data


_OPEN = frozenset(("start_map", "start_array"))
_CLOSE = frozenset(("end_map", "end_array"))
_SCALAR = frozenset(("string", "integer", "double", "number", "boolean", "null"))


def _read_json_list(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    """A JSON array of rows, parsed incrementally (glaive's and ShareGPT's files are single
    arrays of hundreds of MB).

    Rows are built here from the parser's events rather than by `ijson.items`, whose memory
    grows with the square of the nesting depth (2.2 GB for one row 30,000 levels deep): a row
    nested deeper than MAX_DEPTH, or past max_row_bytes, stops being built and becomes a bad
    row, and the rows after it are read."""
    import ijson

    i = offset
    try:
        with p.open("rb") as raw:
            _check_json_list(raw, p)
            f = _Counted(raw)
            events = ijson.basic_parse(f, use_float=True, buf_size=JSON_CHUNK)
            next(events, None)  # the list's own start_array
            for row in _json_list_rows(events, f, spec):
                yield i, row
                i += 1
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc}") from exc
    except (ijson.JSONError, ValueError) as exc:  # ValueError: UnicodeDecodeError and the like
        # Past a syntax error an array cannot be resynchronized: the rest of the file is one
        # bad row, reported with the reason, and the rows before it are used.
        yield i, f"invalid JSON here, the rest of the file is not read: {_parser_error(exc)}"


def _check_json_list(raw: IO[bytes], p: Path) -> None:
    """Refuse a file that is not a JSON list (an object, a scalar), then rewind it."""
    head = raw.read(4096).lstrip()
    if not head.startswith(b"["):
        kind = "an object" if head.startswith(b"{") else "not a list"
        raise SourceError(f"{p}: expected a JSON list of rows, got {kind}")
    raw.seek(0)


def _json_list_rows(
    events: Iterator[tuple[str, Any]], f: _Counted, spec: SourceSpec
) -> Iterator[dict[str, Any] | str]:
    """Each row of the list, in order: the row, or the reason it is a bad row."""
    # A row's size is known to within one read: the limit allows that much more.
    limit = spec.max_row_bytes + JSON_CHUNK
    b = _RowBuilder()
    stack, keys = b.stack, b.keys  # the builder empties these, never replaces them
    for event, value in events:
        # Ordered by how often each event comes (keys and strings most).
        if event == "map_key":
            if stack:
                keys[-1] = value
            continue
        if event in _SCALAR:
            if stack:
                _put(stack[-1], keys, value)
            elif b.depth == 0:
                yield NOT_OBJECT
        elif event in _OPEN:
            b.open(event, f.read_bytes)
        elif event in _CLOSE:
            if b.depth == 0:
                continue  # the end of the list
            if b.close():
                yield b.finish(f.read_bytes - b.start, limit, spec)
            continue
        if stack and f.read_bytes - b.start > limit:
            b.stop("")  # given with its size at the row's end ("": building stopped)


def _put(top: Any, keys: list[str], value: Any) -> None:
    """Add `value` to the open container `top`: appended to a list, or at its key in a map."""
    if type(top) is list:
        top.append(value)
    else:
        top[keys[-1]] = value


class _RowBuilder:
    """The row being built from the parser's events, and why it stopped being built."""

    __slots__ = ("depth", "keys", "reason", "row", "stack", "start")

    def __init__(self) -> None:
        self.depth = 0  # levels open in the row being read
        self.row: Any = None  # the row being built
        self.stack: list[Any] = []  # its open containers (empty: not building), and the key
        self.keys: list[str] = []  # each is at
        self.reason: str | None = None
        self.start = 0

    def open(self, event: str, read_bytes: int) -> None:
        """A [ or { opens: a new row at depth 0, else a container in the row being built."""
        if self.depth == 0:
            self.row, self.start = None, read_bytes
            self.stack.clear()
            self.keys.clear()
            self.reason = NOT_OBJECT if event == "start_array" else None
        if self.reason is None:
            if self.depth == MAX_DEPTH:
                self.stop(TOO_DEEP)
            else:
                new: Any = {} if event == "start_map" else []
                if self.stack:
                    _put(self.stack[-1], self.keys, new)
                else:
                    self.row = new
                self.stack.append(new)
                self.keys.append("")
        self.depth += 1

    def stop(self, reason: str) -> None:
        """Stop building the row (too deep, or too big): only its end is waited for."""
        self.row, self.reason = None, reason
        self.stack.clear()

    def close(self) -> bool:
        """A ] or } closes a container; True when it ends the row."""
        self.depth -= 1
        if self.stack:
            self.stack.pop()
            self.keys.pop()
        return self.depth == 0

    def finish(self, size: int, limit: int, spec: SourceSpec) -> dict[str, Any] | str:
        """The row just ended, or the reason it is a bad row."""
        if not self.reason and size > limit:
            self.reason = _too_big(size, spec, about=True)
        row, self.row = self.row, None
        return row if self.reason is None else self.reason


def _parser_error(exc: Exception) -> str:
    """The parser's own words, without the lines of the file it quotes after them."""
    what = exc.args[0] if exc.args else ""
    text = what.decode("utf-8", "replace") if isinstance(what, bytes) else str(what)
    return " ".join(text.strip().split("\n")[0].split())[:300] or type(exc).__name__


class _LineRefused(Exception):
    """A CSV line that cannot be read (its reason), raised through the csv module's reader."""


class _CsvLines:
    """A CSV file's lines for the csv module, each at most `limit` characters: a longer line is
    thrown away as it is read, and a line that is not UTF-8 is refused, each with its reason
    (raised into the csv reader, which starts its next record on the next line)."""

    def __init__(self, f: IO[str], limit: int) -> None:
        self._f = f
        self._limit = limit

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = self._f.readline(self._limit + 1)
        if not line:
            raise StopIteration
        if len(line) > self._limit and not line.endswith(("\n", "\r")):
            size = len(line.encode("utf-8", "surrogateescape"))
            del line
            while rest := self._f.readline(min(self._limit, SKIP_CHUNK)):
                size += len(rest.encode("utf-8", "surrogateescape"))
                if rest.endswith(("\n", "\r")):
                    break
            raise _LineRefused(
                f"a line of {size / 2**20:.1f} MiB (max_row_bytes is {self._limit / 2**20:.1f})"
            )
        if not line.isascii() and (bad := _UNDECODED.search(line)):
            byte = ord(bad.group()) - 0xDC00
            raise _LineRefused(f"not UTF-8 text (byte 0x{byte:02x} at character {bad.start()})")
        return line


_UNDECODED = re.compile("[\udc80-\udcff]")
"""What errors="surrogateescape" makes of a byte that is not UTF-8."""


def _read_csv(p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    """A CSV file with a header line. Row numbers count records (a quoted field may hold
    newlines), not lines; blank lines are not rows."""
    # Lines are bounded by _CsvLines, and a quoted field that runs on over many lines (an
    # unclosed quote takes the rest of the file) by the csv module's limit, which is the whole
    # process's: each CSV file sets it as it starts.
    csv.field_size_limit(spec.max_row_bytes)
    try:
        with p.open(newline="", encoding="utf-8", errors="surrogateescape") as f:
            reader = csv.reader(_CsvLines(f, spec.max_row_bytes))
            try:
                header = next(reader, None)
            except (_LineRefused, csv.Error) as exc:
                raise SourceError(f"{p}: cannot read the CSV header line: {exc}") from exc
            if header is None:
                return
            i = offset
            while True:
                try:
                    record = next(reader, None)
                except _LineRefused as exc:
                    yield i, str(exc)
                    i += 1
                    continue
                except csv.Error as exc:
                    text = _one_line(exc)
                    if text.startswith("field larger than field limit"):
                        text = f"a field over max_row_bytes ({spec.max_row_bytes / 2**20:.1f} MiB)"
                    yield i, f"not CSV: {text}"
                    i += 1
                    continue
                if record is None:
                    return
                if not record:
                    continue  # a blank line
                yield i, _csv_row(header, record, spec)
                i += 1
    except OSError as exc:
        raise SourceError(f"{p}: cannot read as CSV: {exc}") from exc


def _csv_row(header: list[str], record: list[str], spec: SourceSpec) -> dict[str, Any] | str:
    """A record as csv.DictReader makes it (missing fields None), or why it is not a row."""
    if len(record) > len(header):
        return "has more fields than the header"
    big = _too_big(sum(map(len, record)), spec)
    if big:
        return big
    row: dict[str, Any] = dict(zip(header, record, strict=False))
    for name in header[len(record) :]:
        row[name] = None
    return row


def _arrow_rows(batches: Iterator[Any], p: Path, spec: SourceSpec, offset: int) -> Iterator[Row]:
    """The rows of record batches; a batch that cannot be made Python values (a string column
    holding bytes that are not UTF-8) is taken row by row, each such row a bad row."""
    i = offset
    for batch in batches:
        for row in _batch_rows(batch):
            yield i, row
            i += 1


def _batch_rows(batch: Any) -> list[dict[str, Any] | str]:
    try:
        rows: list[dict[str, Any] | str] = batch.to_pylist()
    except ValueError:  # UnicodeDecodeError, ArrowInvalid
        return [_arrow_row(batch, k) for k in range(batch.num_rows)]
    return rows


def _arrow_row(batch: Any, k: int) -> dict[str, Any] | str:
    try:
        row: dict[str, Any] = batch.slice(k, 1).to_pylist()[0]
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason}, byte 0x{exc.object[exc.start]:02x})"
    except ValueError as exc:
        return f"cannot read this row: {_one_line(exc)}"
    return row


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
