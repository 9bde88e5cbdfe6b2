from __future__ import annotations

from pathlib import Path

import pytest

from regen.conversation import BadRow, Conversation
from regen.errors import SourceError
from regen.sources import read_conversations, read_rows


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
    with pytest.raises(SourceError, match="expected a JSON list"):
        list(read_rows(p))


def test_unknown_suffix_and_missing_file_are_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("")
    with pytest.raises(SourceError, match='set reader = "jsonl"'):
        read_rows(tmp_path / "d.txt")


def test_read_conversations_honours_limit_and_mixes_bad_rows(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"messages": [{"role": "user", "content": "a"}]}\n'
        "nope\n"
        '{"messages": [{"role": "user", "content": "b"}]}\n'
    )
    out = list(read_conversations("ds", p, "openai"))
    assert [type(o) for o in out] == [Conversation, BadRow, Conversation]
    assert len(list(read_conversations("ds", p, "openai", limit=2))) == 2
