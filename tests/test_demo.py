"""`regen demo` from the command line, as `make demo` runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import query, run_cli


@pytest.mark.slow
def test_demo_prints_a_summary_that_matches_its_exports(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "summary" in proc.stdout and "output:" in proc.stdout
    exported = {}
    for name in ("chat", "sharegpt", "code"):
        lines = (out / "export" / f"{name}.jsonl").read_text().splitlines()
        for line in lines:
            rec = json.loads(line)
            assert rec["id"] and rec["conversations"][-1]["role"] == "assistant"
        exported[name] = len(lines)
        row = re.search(rf"│ {name}\s+│(.*)", proc.stdout)
        assert row, proc.stdout
        cells = [c.strip() for c in row.group(1).split("│") if c.strip()]
        # rows, bad, dupes, items, done, failed, ..., exported (last)
        assert len(lines) == int(cells[-1])
        # An answer whose history holds the dataset's own assistant turns is left out of the
        # run's SpecForge export (SpecForge would train on those turns), and the summary says so.
        history = [json.loads(line)["provenance"]["history"] for line in lines]
        assert "source" not in history
        left = re.search(rf"export: (\d+) answer\(s\) of {name} left out", proc.stdout)
        assert int(cells[4]) == len(lines) + (int(left.group(1)) if left else 0)
        assert int(cells[5]) == 0
    assert sum(exported.values()) >= 150
    # Every exported answer rebuilt as token ids, each matching what the simulator billed.
    audit = re.search(
        r"audit: (\d+) answers rebuilt .*?; ([\d.]+)% match .*?, ([\d.]+)% the", proc.stdout
    )
    assert audit, proc.stdout
    [(whole,)] = query(out, "SELECT count(*) FROM results WHERE finish_reason != 'length'")
    assert int(audit.group(1)) == whole >= 250  # answers cut at max_tokens are left out
    assert audit.group(2) == audit.group(3) == "100.0"
    assert ", 0 do not parse back" in proc.stdout
    # A second demo starts fresh in the same folder.
    again = run_cli("demo", "--out", str(out))
    assert again.returncode == 0, again.stderr


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    proc = run_cli("demo", "--out", str(tmp_path))
    assert proc.returncode == 1
    assert "is not a regen demo folder" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
