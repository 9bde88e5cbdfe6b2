"""Start `regen sim` as its own process pinned to core 0, for the benchmarks."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

FILLER = "the of and to in is that for it as with was on be by this are".split()  # noqa: SIM905
"""Common words for synthetic prompts: the simulator's answer lengths follow prompt length."""


def start_sim(config_toml: str, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The simulator process and its base URL; the caller terminates it."""
    cfg = tmp / f"sim-{time.monotonic_ns()}.toml"
    cfg.write_text(config_toml)
    proc = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-m",
            "regen",
            "sim",
            "--port",
            "0",
            "--config",
            str(cfg),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    # The first line is "regen sim listening on http://127.0.0.1:PORT/api/v1".
    return proc, proc.stdout.readline().rsplit(" ", 1)[1].strip()


def machine_line() -> str:
    """The machine a benchmark ran on, for its report."""
    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
