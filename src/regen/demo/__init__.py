"""`regen demo`: the bundled job and datasets, run against an in-process simulator."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from regen.config import Job, load_job

MARKER = ".regen-demo"
DEMO_KEY = "sk-demo-not-a-secret"
"""The simulator accepts any key; the demo never needs a real one."""


def prepare_demo(out_dir: Path) -> Path:
    """Copy the bundled job and data into `out_dir` (a fresh copy each time); return job path."""
    if out_dir.exists():
        if not (out_dir / MARKER).exists() and any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} exists and is not a regen demo folder")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / MARKER).write_text("made by regen demo; removed by the next regen demo\n")
    bundle = resources.files("regen.demo")
    (out_dir / "job.toml").write_text(bundle.joinpath("job.toml").read_text())
    data = out_dir / "data"
    data.mkdir()
    for entry in bundle.joinpath("data").iterdir():
        (data / entry.name).write_bytes(entry.read_bytes())
    return out_dir / "job.toml"


def demo_job(out_dir: Path, base_url: str) -> Job:
    job_path = prepare_demo(out_dir)
    return load_job(job_path, **{"endpoint.base_url": base_url})
