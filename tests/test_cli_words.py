"""The smaller words of issue 48: `regen families` read through a pipe (no traceback when the
reader stops early, 80 columns, what `auto` looks for); no samples change on a fresh output
folder; no "other servers" when there is one; no "up to $0.0000" where nothing is priced."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from regen.engine.holds import HoldSummary
from regen.engine.stats import RunStats
from regen.run.dispatch import end_lines
from regen.sim import SimConfig, sim_in_thread
from regen.state.runs import OutageRecord
from regen.view.progress import outages_line
from tests.conftest import run_cli, write_job


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


def test_a_fresh_output_folder_says_no_samples_change(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        job.write_text(
            job.read_text().replace("temperature = 0.7", "temperature = 0.7\nsamples = 2")
        )
        res = run_cli("run", str(job))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "samples 1 -> 2" not in res.stdout and "(items are samples: 2 per prompt)" in res.stdout


def test_an_outage_of_the_only_server_does_not_name_other_servers() -> None:
    out = [OutageRecord(1, "gpu1", 100.0, 130.0, 4)]
    line = outages_line("gpu1", out, now=200.0)
    assert "other servers" not in line and "4 requests re-sent" in line


@dataclass
class _Keeper:
    """A HoldKeeper's end-of-run face: requests held, on an endpoint without prices."""

    released_unverified: float = 0.0

    def summary(self) -> HoldSummary:
        return HoldSummary(requests=3, usd=0.0)


def test_requests_held_on_an_unpriced_endpoint_are_not_said_to_cost_up_to_zero() -> None:
    lines = end_lines(_Keeper(), RunStats(datasets={}))  # type: ignore[arg-type]
    assert lines[0].startswith("budget: 3 requests may still be billed (unpriced)"), lines
