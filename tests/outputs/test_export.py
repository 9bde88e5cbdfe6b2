from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.errors import StateError
from regen.outputs.export import write_jsonl_atomic


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


def test_a_run_removes_what_a_killed_export_left(tmp_path: Path) -> None:
    """A kill inside an export leaves `.NAME.jsonl.tmp` (the run's own export) or a
    `.FORMAT.tmp-PID` folder (regen export); the next run removes them, and puts back an
    export folder whose swap was cut between its two renames."""
    import os

    from regen.outputs.export import clean_stale_exports

    export = tmp_path / "export"
    export.mkdir()
    (export / ".chat.jsonl.tmp").write_text("half a line")
    gone = 2**22 + 7  # above the usual pid_max: no such process
    (export / f".specforge.tmp-{gone}").mkdir()
    (export / f".openai.old-{gone}").mkdir()
    (export / f".openai.old-{gone}" / "manifest.json").write_text("{}")
    (export / f".sharegpt.tmp-{os.getpid()}").mkdir()  # a live export: left alone
    removed = clean_stale_exports(export)
    assert sorted(removed) == sorted(
        [".chat.jsonl.tmp", f".specforge.tmp-{gone}", f".openai.old-{gone} (put back as openai)"]
    )
    assert sorted(p.name for p in export.iterdir()) == sorted(
        ["openai", f".sharegpt.tmp-{os.getpid()}"]
    )
    assert (export / "openai" / "manifest.json").read_text() == "{}"
