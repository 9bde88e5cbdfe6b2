from __future__ import annotations

import os
from pathlib import Path

import pytest

from regen.errors import StateError
from regen.lock import RunLock


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path: Path) -> None:
    with RunLock(tmp_path / "out") as first:
        assert first.stale_pid is None
        assert (tmp_path / "out" / "run.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(StateError, match=f"another regen run \\(pid {os.getpid()}\\)"):
            RunLock(tmp_path / "out").acquire()
    # Released cleanly: the file is empty and the next holder finds nothing stale.
    assert (tmp_path / "out" / "run.lock").read_text() == ""
    with RunLock(tmp_path / "out") as again:
        assert again.stale_pid is None


def test_a_lock_file_left_by_a_dead_holder_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / "run.lock").write_text("4242\n")  # no process holds the flock
    with RunLock(tmp_path) as lock:
        assert lock.stale_pid == 4242
        assert (tmp_path / "run.lock").read_text() == f"{os.getpid()}\n"


def test_an_output_path_that_cannot_be_a_directory_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match="cannot use output directory"):
        RunLock(tmp_path / "file" / "out").acquire()
