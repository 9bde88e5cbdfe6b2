"""The smaller words of issue 48: `regen families` read through a pipe (no traceback when the
reader stops early, 80 columns, what `auto` looks for)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import run_cli


def test_families_into_a_pipe_that_closes_early_ends_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen", "families", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    # The reader goes away before the first write (as `head` does after its lines; closing
    # at once makes every write fail, however fast the process is).
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_families_piped_is_80_columns_and_says_what_auto_looks_for() -> None:
    res = run_cli("families")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert 'family = "auto" reads the model\'s chat template' in res.stdout
    assert "  auto looks for: '<|im_assistant|>'" in res.stdout
