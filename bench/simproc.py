"""Start `regen sim` as its own process pinned to core 0, for the benchmarks."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

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


def late(base_url: str) -> dict[str, Any]:
    """How well a running simulator kept its answers' time so far (its `/_sim/stats` "late":
    whole answers timed, those late by over 50 ms, the mean and the worst lateness)."""
    root = base_url.split("/api/v1")[0].split("/v1")[0]
    with urllib.request.urlopen(f"{root}/_sim/stats", timeout=10) as r:
        return dict(json.load(r).get("late") or {})


def late_since(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """`late` for the answers timed between two readings (the worst is of all of them)."""
    if not now:
        return {}
    n = now.get("answers", 0) - before.get("answers", 0)
    total = now.get("mean_s", 0.0) * now.get("answers", 0)
    total -= before.get("mean_s", 0.0) * before.get("answers", 0)
    return {
        "answers": n,
        "over_50ms": now.get("over_50ms", 0) - before.get("over_50ms", 0),
        "mean_s": total / n if n else 0.0,
        "worst_s": now.get("worst_s", 0.0),
    }


def late_cell(late: dict[str, Any]) -> str:
    """A `late` reading for a report's table: answers late by over 50 ms of those timed, with
    the mean and the worst lateness."""
    if not late.get("answers"):
        return "-"
    return (
        f"{late['over_50ms']} of {late['answers']} ({late['mean_s'] * 1000:.0f} ms, "
        f"{late['worst_s'] * 1000:.0f} ms)"
    )


def machine_line() -> str:
    """The machine a benchmark ran on, for its report."""
    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
