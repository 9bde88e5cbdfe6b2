"""Whatever a file holds, its readers yield rows or bad rows (with their row numbers and a
one-line reason) and read on: no row can crash a run, hold memory past max_row_bytes, or fill
state.db with its bad-row records."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regen.conversation import BadRow
from regen.errors import SourceError
from regen.sources import read_rows
from regen.sources.readers import MAX_DEPTH
from regen.state.db import Store
from regen.state.sources import KEPT_BAD_ROWS, KEPT_BAD_ROWS_READ
from tests.conftest import chat_rows, fuzz_examples, query, run_cli, write_job

CHAT = json.dumps({"messages": [{"role": "user", "content": "hello"}]})
DEEP = "[" * 100_000
"""One row nested 100,000 levels deep (it crashed `regen run` with a RecursionError)."""


def rows_of(path: Path, **options: Any) -> list[tuple[int, Any]]:
    return list(read_rows(path, **options))


def reasons(rows: list[tuple[int, Any]]) -> dict[int, str]:
    return {i: r for i, r in rows if isinstance(r, str)}


# JSONL: each kind of hostile line is one bad row with its number; the rows around it are read.

HOSTILE_LINES: dict[str, tuple[bytes, str]] = {
    "deep list": (DEEP.encode(), "nested deeper than 128 levels"),
    "deep objects": (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested deeper than 128 levels"),
    "deep inside what orjson reads": (
        b'{"a": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}",
        "nested deeper than 128 levels",
    ),
    "invalid UTF-8": (b'{"a": "\xff\xfe"}', "not UTF-8 text (byte 0xff at byte 7)"),
    "a raw NUL": (b'{"a": "x\x00y"}', "invalid JSON: Invalid control character"),
    "only NULs": (b"\x00\x00\x00", "invalid JSON"),
    "a lone surrogate": (b'{"a": "\\ud800"}', "text with a lone surrogate (not Unicode)"),
    "a lone surrogate as a key": (b'{"\\udfff": 1, "b": NaN}', "text with a lone surrogate"),
    "an integer of 5,000 digits": (b'{"a": ' + b"9" * 5000 + b"}", "invalid JSON: Exceeds"),
    "garbage": (b"\x01\x1b[2J }{ not json", "invalid JSON"),
    "binary garbage": (bytes(range(1, 256)).replace(b"\n", b""), "not UTF-8 text (byte 0x80"),
    "a truncated row": (CHAT[:-7].encode(), "invalid JSON"),
}


@pytest.mark.parametrize("kind", HOSTILE_LINES)
def test_a_hostile_jsonl_line_is_one_bad_row_and_the_rows_after_it_are_read(
    tmp_path: Path, kind: str
) -> None:
    line, reason = HOSTILE_LINES[kind]
    p = tmp_path / "d.jsonl"
    p.write_bytes(CHAT.encode() + b"\n" + line + b"\n\n" + CHAT.encode() + b"\n")
    rows = rows_of(p)
    assert [i for i, _ in rows] == [0, 1, 3]
    assert rows[0][1] == rows[2][1] == json.loads(CHAT)
    assert isinstance(rows[1][1], str) and rows[1][1].startswith(reason), rows[1][1]
    assert "\n" not in rows[1][1] and len(rows[1][1]) < 400


def test_a_row_as_deep_as_allowed_is_read(tmp_path: Path) -> None:
    deepest = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": ' + deepest + "}\n" + '{"a": ' + deepest + ', "b": NaN}\n')
    assert all(isinstance(r, dict) for _, r in rows_of(p))
    q = tmp_path / "d.json"
    q.write_text('[{"a": ' + deepest + "}]")
    assert all(isinstance(r, dict) for _, r in rows_of(q))


def test_a_line_past_max_row_bytes_is_skipped_as_it_is_read(tmp_path: Path) -> None:
    """8 MiB on one line, read with max_row_bytes 64 KiB: Python's allocations stay near the
    limit (they held the whole line), and the line's number and size are the reason."""
    p = tmp_path / "d.jsonl"
    with p.open("wb") as f:
        f.write(CHAT.encode() + b"\n")
        f.write(b'{"a": "')
        for _ in range(128):
            f.write(b"x" * 65536)
        f.write(b'"}\n' + CHAT.encode() + b"\n" + b"y" * 100_000)  # the last line unended
    tracemalloc.start()
    try:
        rows = rows_of(p, max_row_bytes=65536)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert [i for i, _ in rows] == [0, 1, 2, 3]
    assert rows[1][1] == "row is 8.0 MiB (max_row_bytes is 0.1)"
    assert rows[2][1] == json.loads(CHAT)
    assert rows[3][1] == "row is 0.1 MiB (max_row_bytes is 0.1)"


# JSON lists: a row nested deep or too big is a bad row; the rows after it are read.


def test_a_deep_row_in_a_json_list_is_a_bad_row_without_its_memory(tmp_path: Path) -> None:
    """ijson.items held the square of the depth (250 MB at 10,000 levels, 2.2 GB at 30,000)."""
    p = tmp_path / "d.json"
    p.write_text(
        f'[{CHAT}, {{"a": {"[" * 3000}{"]" * 3000}}}, {"[" * 3000}{"]" * 3000}, {CHAT}, 7]'
    )
    tracemalloc.start()
    try:
        rows = rows_of(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert rows == [
        (0, json.loads(CHAT)),
        (1, "nested deeper than 128 levels of [ and {"),
        (2, "row is not a JSON object"),
        (3, json.loads(CHAT)),
        (4, "row is not a JSON object"),
    ]


def test_a_json_list_row_past_max_row_bytes_is_not_built(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    many = ", ".join(['"' + "x" * 50 + '"'] * 80_000)  # 4 MiB of small strings
    p.write_text(f'[{CHAT}, {{"a": [{many}]}}, {CHAT}]')
    tracemalloc.start()
    try:
        rows = rows_of(p, max_row_bytes=65536)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert [i for i, _ in rows] == [0, 1, 2]
    assert str(rows[1][1]).startswith("row is about 4.") and "(max_row_bytes is 0.1)" in rows[1][1]
    assert rows[2][1] == json.loads(CHAT)


def test_a_broken_json_list_says_why_in_the_parsers_first_line(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    p.write_bytes(b'[{"a": 1}, {"a": "\xff"}, {"b": 2}]')
    assert rows_of(p) == [
        (0, {"a": 1}),
        (
            1,
            "invalid JSON here, the rest of the file is not read: lexical error: invalid bytes "
            "in UTF8 string.",
        ),
    ]


# CSV and Parquet.


def test_a_csv_line_that_is_not_utf8_or_too_long_is_a_bad_row(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_bytes(
        b"instruction,output\n"
        b"a,1\n"
        b"\xff\xfe,2\n"  # was: the whole file refused ("cannot read as CSV")
        b"x\x00y,3\n" + b"z" * 200_000 + b",4\n"
        b"b,5\n"
    )
    rows = rows_of(p, max_row_bytes=65536)
    assert rows == [
        (0, {"instruction": "a", "output": "1"}),
        (1, "not UTF-8 text (byte 0xff at character 0)"),
        (2, {"instruction": "x\x00y", "output": "3"}),
        (3, "a line of 0.2 MiB (max_row_bytes is 0.1)"),
        (4, {"instruction": "b", "output": "5"}),
    ]


def test_an_unclosed_csv_quote_does_not_take_the_rest_of_the_file(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text('instruction,output\na,1\n"open,2\n' + "more,3\n" * 20_000)
    rows = rows_of(p, max_row_bytes=65536)
    assert rows[0] == (0, {"instruction": "a", "output": "1"})
    assert rows[1] == (1, "not CSV: a field over max_row_bytes (0.1 MiB)")


def test_a_parquet_string_that_is_not_utf8_is_a_bad_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.array([b"ok", b"\xff\xfe", b"fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"a": text, "b": [1, 2, 3]}), tmp_path / "d.parquet")
    assert rows_of(tmp_path / "d.parquet") == [
        (0, {"a": "ok", "b": 1}),
        (1, "not UTF-8 text (invalid start byte, byte 0xff)"),
        (2, {"a": "fine", "b": 3}),
    ]


# The commands: a hostile row is a bad row in `regen inspect` and `regen run`.


def test_inspect_and_run_report_a_deep_row_and_go_on(tmp_path: Path, sim: Any) -> None:
    rows = [json.dumps(r) for r in chat_rows(3)]
    (tmp_path / "d.jsonl").write_text(f"{rows[0]}\n{DEEP}\n{rows[1]}\n{rows[2]}\n")
    job = write_job(tmp_path, sim.base_url, datasets=[("d", "d.jsonl", "openai")])
    res = run_cli("inspect", str(job), "--dataset", "d", "--rows", "4", "--json")
    assert res.returncode == 0, res.stderr
    shown = {r["row_index"]: r["reason"] for r in json.loads(res.stdout)["rows"]}
    assert shown[1] == "nested deeper than 128 levels of [ and {"
    res = run_cli("run", str(job))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    assert query(out, "SELECT COUNT(*) FROM items WHERE status = 'done'") == [(3,)]
    assert query(out, "SELECT row_index, reason FROM bad_rows") == [
        (1, "nested deeper than 128 levels of [ and {")
    ]


# state.db keeps the first KEPT_BAD_ROWS bad rows of a dataset, and says how many there were.


def test_bad_row_records_are_capped_and_the_true_total_is_still_said(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "out")
    try:
        store.sources.register("d", 0, "d.jsonl")
        n = KEPT_BAD_ROWS + 2500
        bad = [BadRow("d", i, f"invalid JSON: row {i}") for i in range(n)]
        store.sources.record_read("d", n, 0, bad)
        kept = store._db.execute("SELECT COUNT(*), MAX(row_index) FROM bad_rows").fetchone()
        assert kept == (KEPT_BAD_ROWS, KEPT_BAD_ROWS - 1)
        groups = store.sources.bad_row_reasons()
        assert sum(g.rows for g in groups) == n
        past = next(g for g in groups if g.example.startswith("reasons not kept"))
        assert past.rows == 2500 and past.first_rows == list(range(10_000, 10_005))
        assert "12,500 rows not used in all, the first 10,000 kept" in past.example
        # A reader may hold only the first bad rows and count the rest.
        store.sources.record_read("d", n, 0, bad[:KEPT_BAD_ROWS_READ], bad_total=n)
        assert store.sources.bad_row_reasons() == groups
        # A read with fewer bad rows leaves no group of rows not kept.
        store.sources.record_read("d", 3, 0, bad[:3])
        assert [g.rows for g in store.sources.bad_row_reasons()] == [3]
    finally:
        store.close()


def test_a_garbage_file_keeps_a_bounded_state_db_and_status_says_every_row(
    tmp_path: Path, sim: Any
) -> None:
    n = KEPT_BAD_ROWS + 1500
    (tmp_path / "d.jsonl").write_bytes(b"\xff garbage \x00\n" * n + CHAT.encode() + b"\n")
    job = write_job(tmp_path, sim.base_url, datasets=[("d", "d.jsonl", "openai")])
    res = run_cli("plan", str(job), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert sum(g["rows"] for g in plan["bad_row_reasons"]) == n
    out = tmp_path / "out"
    assert query(out, "SELECT COUNT(*) FROM bad_rows") == [(KEPT_BAD_ROWS,)]
    assert query(out, "SELECT bad_rows FROM datasets") == [(n,)]
    status = json.loads(run_cli("status", str(out), "--json").stdout)
    assert sum(g["rows"] for g in status["bad_row_reasons"]) == n
    (past,) = [g for g in status["bad_row_reasons"] if g["first_rows"][0] == KEPT_BAD_ROWS]
    assert past["example"].startswith(f"reasons not kept: {n:,} rows not used in all, the first")
    assert "reasons not kept" in run_cli("status", str(out)).stdout


def test_the_error_for_an_unusable_dataset_counts_every_row(tmp_path: Path) -> None:
    n = KEPT_BAD_ROWS + 10
    (tmp_path / "d.jsonl").write_bytes(b"nope\n" * n)
    job = write_job(tmp_path, "http://127.0.0.1:9", datasets=[("d", "d.jsonl", "openai")])
    res = run_cli("run", str(job))
    assert res.returncode == 1
    assert f"none of the {n} rows of" in res.stderr


# Properties: any bytes at all, and every line is counted.

MAX_ROW = 512
"""max_row_bytes for the property tests: generated lines cross it both ways."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # orjson reads larger ones as floats
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


def _nested(depth: int, leaf: str) -> str:
    return '{"a": ' * depth + leaf + "}" * depth


hostile_lines = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(
        lambda d: json.dumps(d).encode()
    ),
    st.integers(1, 3 * MAX_DEPTH).map(lambda n: _nested(n, "1").encode()),
    st.integers(1, 3 * MAX_DEPTH).map(lambda n: (_nested(1, "[" * n + "]" * n)).encode()),
    st.integers(1, 3 * MAX_ROW).map(lambda n: b'{"a": "' + b"x" * n + b'"}'),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),  # invalid UTF-8, NUL, ...
    st.text(st.characters(max_codepoint=0x1F), max_size=10).map(
        lambda t: ('{"c": "' + t.replace("\n", "") + '"}').encode("utf-8", "surrogatepass")
    ),
    st.sampled_from(
        [b"", b"   ", b"\r", b"\x00", b'{"a": "\\ud800"}', b'{"a": NaN}', b"[]", b"[" * 2000]
        + [b'{"a": ' + b"9" * 5000 + b"}"]
    ),
    st.tuples(
        st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=3),
        st.integers(0, 60),
    ).map(lambda t: json.dumps(t[0]).encode()[: t[1]]),  # truncated
)


def _depth(value: Any) -> int:
    level, depth = [value], 0
    while level:
        depth += 1
        level = [
            c
            for v in level
            for c in (v.values() if isinstance(v, dict) else v)
            if isinstance(c, dict | list)
        ]
    return depth


def _check_rows(rows: list[tuple[int, Any]]) -> None:
    """Each a row no deeper than MAX_DEPTH, or a one-line reason."""
    for i, row in rows:
        assert isinstance(i, int)
        if isinstance(row, dict):
            assert _depth(row) <= MAX_DEPTH
        else:
            assert isinstance(row, str) and row and "\n" not in row


@settings(
    max_examples=fuzz_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(hostile_lines, max_size=12), st.booleans())
def test_jsonl_yields_a_row_or_a_bad_row_for_every_line(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], ended: bool
) -> None:
    p = tmp_path_factory.mktemp("jsonl") / "d.jsonl"
    data = b"\n".join(lines) + (b"\n" if ended and lines else b"")
    p.write_bytes(data)
    rows = rows_of(p, max_row_bytes=MAX_ROW)
    _check_rows(rows)
    pieces = data.split(b"\n")
    sizes = [len(x) + 1 for x in pieces[:-1]] + [len(pieces[-1])]
    want = [k for k, x in enumerate(pieces) if x.strip() or sizes[k] > MAX_ROW]
    assert [i for i, _ in rows] == want
    for i, row in rows:
        if isinstance(row, dict):
            assert row == json.loads(pieces[i])


json_list_items = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(json.dumps),
    json_values.map(json.dumps),
    st.integers(1, 3 * MAX_DEPTH).map(lambda n: _nested(n, "1")),
    st.integers(1, 3 * MAX_ROW).map(lambda n: '{"a": ["' + '", "'.join("x" * n) + '"]}'),
)


@settings(
    max_examples=fuzz_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(json_list_items, max_size=10), st.integers(0, 10_000), st.binary(max_size=3))
def test_a_json_list_cut_or_damaged_anywhere_yields_rows_then_one_bad_row(
    tmp_path_factory: pytest.TempPathFactory, items: list[str], cut: int, junk: bytes
) -> None:
    p = tmp_path_factory.mktemp("json") / "d.json"
    whole = ("[" + ", ".join(items) + "]").encode()
    at = cut % (len(whole) + 1)
    damaged = whole[:at] + junk if junk or at < len(whole) else whole
    p.write_bytes(damaged)
    try:
        rows = rows_of(p, max_row_bytes=MAX_ROW)
    except SourceError as exc:
        assert not damaged.lstrip().startswith(b"["), exc  # only a file that is no list
        return
    _check_rows(rows)
    assert [i for i, _ in rows] == list(range(len(rows)))
    if damaged == whole:
        assert len(rows) == len(items)
        for (_, row), item in zip(rows, items, strict=True):
            if isinstance(row, dict):
                assert row == json.loads(item)


@settings(
    max_examples=fuzz_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.binary(max_size=30) | st.text(max_size=30).map(str.encode), max_size=10))
def test_csv_of_any_bytes_yields_rows_or_bad_rows(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes]
) -> None:
    p = tmp_path_factory.mktemp("csv") / "d.csv"
    p.write_bytes(b"a,b\n" + b"\n".join(lines))
    rows = rows_of(p, max_row_bytes=MAX_ROW)
    _check_rows(rows)
    assert [i for i, _ in rows] == list(range(len(rows)))


@settings(
    max_examples=fuzz_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.integers(0, 10_000), st.binary(max_size=8))
def test_a_truncated_or_damaged_parquet_file_is_a_source_error_or_rows(
    tmp_path_factory: pytest.TempPathFactory, cut: int, junk: bytes
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("parquet")
    table = pa.table({"a": ["x" * k for k in range(50)], "b": list(range(50))})
    pq.write_table(table, d / "whole.parquet", row_group_size=10)
    whole = (d / "whole.parquet").read_bytes()
    at = cut % (len(whole) + 1)
    (d / "d.parquet").write_bytes(whole[:at] + junk + whole[at + len(junk) :])
    try:
        rows = rows_of(d / "d.parquet")
    except SourceError as exc:
        assert "\n" not in str(exc)
        return
    _check_rows(rows)
    assert [i for i, _ in rows] == list(range(len(rows)))
