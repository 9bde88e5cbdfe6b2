from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from regen.conversation import BadRow, Conversation
from regen.errors import SourceError
from regen.sources import Source, read_rows


def test_jsonl_reports_bad_lines_by_number_and_keeps_going(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{broken\n\n[1, 2]\n{"b": 2}\n')
    rows = list(read_rows(p))
    assert rows[0] == (0, {"a": 1})
    assert rows[1][0] == 1 and str(rows[1][1]).startswith("invalid JSON")
    assert rows[2] == (3, "row is not a JSON object")
    assert rows[3] == (4, {"b": 2})


def test_json_list_and_its_errors(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    p.write_text('[{"a": 1}, 3]')
    assert list(read_rows(p)) == [(0, {"a": 1}), (1, "row is not a JSON object")]
    p.write_text('{"a": 1}')
    with pytest.raises(SourceError, match="expected a JSON list of rows, got an object"):
        list(read_rows(p))
    # A file cut short (an interrupted download): the rows before the cut are used.
    p.write_text('[{"a": 1}, {"b": 2.5}, {"c": [1, 2')
    rows = list(read_rows(p))
    assert rows[:2] == [(0, {"a": 1}), (1, {"b": 2.5})]
    assert rows[2][0] == 2 and str(rows[2][1]).startswith("invalid JSON here, the rest")


def test_unknown_suffix_and_missing_file_are_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("")
    with pytest.raises(SourceError, match='set reader = "jsonl", "json", "parquet"'):
        read_rows(tmp_path / "d.txt")


def test_a_source_honours_limit_and_mixes_bad_rows(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"messages": [{"role": "user", "content": "a"}]}\n'
        "nope\n"
        '{"messages": [{"role": "user", "content": "b"}]}\n'
    )
    out = list(Source("ds", p, "openai"))
    assert [type(o) for o in out] == [Conversation, BadRow, Conversation]
    assert len(list(Source("ds", p, "openai", limit=2))) == 2


ROWS = [
    {"messages": [{"role": "user", "content": f"q{i}"}], "tag": "a" if i % 2 else "b"}
    for i in range(2500)
]


def test_parquet_is_streamed_in_batches_with_row_numbers(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), p, row_group_size=700)
    rows = list(read_rows(p))
    assert [r[0] for r in rows] == list(range(2500))
    assert rows[1234][1] == ROWS[1234]


def test_csv_rows_and_a_row_with_too_many_fields(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text('instruction,output\n"Say ""hi""","hi"\nx,y,z\n"multi\nline",ok\n')
    rows = list(read_rows(p))
    assert rows[0] == (0, {"instruction": 'Say "hi"', "output": "hi"})
    assert rows[1] == (1, "has more fields than the header")
    assert rows[2] == (2, {"instruction": "multi\nline", "output": "ok"})


def test_save_to_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS[:50])
    ds.save_to_disk(str(tmp_path / "one"))
    assert [r[1] for r in read_rows(tmp_path / "one")] == ROWS[:50]
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(
        str(tmp_path / "dict")
    )
    assert len(list(read_rows(tmp_path / "dict"))) == 50  # train by default
    assert len(list(read_rows(tmp_path / "dict", split="test"))) == 3
    with pytest.raises(SourceError, match="no split 'dev' in the saved dataset"):
        read_rows(tmp_path / "dict", split="dev")


def test_folder_of_files_in_name_order_and_by_split(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-00000-of-00002.jsonl").write_text('{"a": 0}\n{"a": 1}\n')
    (tmp_path / "data" / "train-00001-of-00002.json").write_text('[{"a": 2}]')
    (tmp_path / "data" / "test-00000-of-00001.jsonl").write_text('{"a": 9}\n')
    (tmp_path / "data" / "README.md").write_text("not data")
    assert [r for _, r in read_rows(tmp_path / "data", split="train")] == [
        {"a": 0},
        {"a": 1},
        {"a": 2},
    ]
    assert [i for i, _ in read_rows(tmp_path / "data")] == [0, 1, 2, 3]
    with pytest.raises(SourceError, match="no data files for split 'dev'"):
        read_rows(tmp_path / "data", split="dev")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no data files"):
        read_rows(tmp_path / "empty")


def test_giant_lines_are_bad_rows_not_loaded(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": "' + "x" * 5000 + '"}\n{"a": 1}\n')
    rows = list(read_rows(p, max_row_bytes=1000))
    assert rows[0] == (0, "row is 0.0 MiB (max_row_bytes is 0.0)")
    assert rows[1] == (1, {"a": 1})


def test_a_hub_id_fails_with_one_clear_line_where_the_hub_is_unreachable() -> None:
    pytest.importorskip("datasets")
    code = (
        "from regen.sources import read_rows\n"
        "try:\n"
        "    list(read_rows('hf://open-r1/Mixture-of-Thoughts', config='math', split='train'))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc, sep='|')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    kind, text = out.rstrip("\n").split("|", 1)
    assert kind == "SourceError"
    assert text.startswith(
        "hf://open-r1/Mixture-of-Thoughts (config math, split train): cannot load from the "
        "Hugging Face hub: "
    )
    assert "\n" not in text


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
def test_large_files_are_streamed_not_loaded_whole(tmp_path: Path, kind: str) -> None:
    import tracemalloc

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    rows = [{"instruction": rng.randbytes(1000).hex(), "output": "ok"} for _ in range(6000)]
    p = tmp_path / f"big.{kind}"
    if kind == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        p.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=500)
    size = p.stat().st_size
    del rows
    tracemalloc.start()
    try:
        n = sum(1 for _ in read_rows(p))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 6000
    assert size > 10 * 2**20
    assert peak < size / 4, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
