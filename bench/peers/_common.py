"""What every peer runner shares: the prompts, the answers already written, the output file.

A runner runs in its peer's own virtual environment (bench/compare.py makes it), with the run
folder as its working directory: `prompts.jsonl` in, `out.jsonl` out (one `{"id", "content"}`
line per answer). Standard library only, so it imports under any peer's interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

KEY = "sk-bench-not-a-secret"
MODEL = "bench/model"
MAX_TOKENS = 2048


def args() -> tuple[str, int, bool]:
    """(simulator URL, requests in flight, whether this is a restart) from the command line."""
    return sys.argv[1], int(sys.argv[2]), "--resume" in sys.argv[3:]


def rows() -> list[tuple[int, list[dict[str, str]]]]:
    """(row id, messages) of every prompt, in file order."""
    with open("prompts.jsonl") as f:
        return [(i, json.loads(line)["messages"]) for i, line in enumerate(f)]


def done_ids(path: str = "out.jsonl") -> set[int]:
    """The ids a previous run wrote (a torn last line is skipped)."""
    done: set[int] = set()
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    done.add(int(json.loads(line)["id"]))
    return done
