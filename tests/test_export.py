from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.errors import StateError
from regen.export import write_jsonl_atomic


def test_an_export_that_fails_half_way_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "export" / "chat.jsonl"
    assert write_jsonl_atomic(path, [{"id": "a"}, {"id": "b"}]) == 2
    before = path.read_bytes()

    def records() -> Iterator[dict[str, Any]]:
        yield {"id": "c"}
        raise OSError(28, "No space left on device")

    with pytest.raises(StateError, match="No space left on device; every result is kept"):
        write_jsonl_atomic(path, records())
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["chat.jsonl"]  # no temporary file left
