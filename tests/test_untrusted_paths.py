"""Links in a folder regen writes in: one that leads out of the folder is refused by every
writer and deleter (the run, `regen export` in each format with its parts and temporary
folders, `regen report`, run.log, state.db's files), before anything is touched, with one line
that names it; the link's target keeps its files, bytes and times. A link that stays inside
the folder is followed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import SECRET_KEY, chat_rows, run_cli, write_job, write_rows

FORMATS = ("specforge", "openai", "sharegpt", "tokenized")
FAMILY = ("--family", "kimi-k2.5")
DEAD = 2**22 + 4321
"""A pid above the default pid_max: no process has it (a killed export's leftovers)."""


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job run to the end once: its job file, dataset and output directory."""
    tmp = tmp_path_factory.mktemp("job")
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp, sim.base_url)
        assert run_cli("run", str(job)).returncode == 0
    return tmp


@pytest.fixture
def job(finished: Path, tmp_path: Path) -> Path:
    """A fresh copy of the finished job; its output directory is `job/out`."""
    shutil.copytree(finished, tmp_path / "job", symlinks=True)
    return tmp_path / "job"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of someone else's files, at each name regen writes."""
    folder = tmp_path / "outside"
    names = ["chat.jsonl", ".chat.jsonl.tmp", "report.html", "run.log", "state.db-shm"]
    for fmt in FORMATS:
        names += [f"{fmt}/manifest.json", f"{fmt}/README.md", f"{fmt}/train/chat.jsonl"]
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"not regen's: {name}\n")
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and folder under `folder`: its bytes and modification time (a folder's time
    changes when an entry is made or removed in it)."""
    entries = [folder, *sorted(folder.rglob("*"))]
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in entries
    }


def refused(res: subprocess.CompletedProcess[str], link: Path) -> str:
    """The one line a refusal prints, which names the link."""
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {link} is a link to "), line
    assert "touched nothing" in line and "outside" in line, line
    return line


def export_args(out: Path, fmt: str, *more: str) -> list[str]:
    return ["export", str(out), "--format", fmt, *(FAMILY if fmt == "tokenized" else ()), *more]


@pytest.mark.parametrize("fmt", FORMATS)
def test_regen_export_refuses_an_export_folder_that_links_out(
    job: Path, outside: Path, fmt: str
) -> None:
    out = job / "out"
    shutil.rmtree(out / "export")
    (out / "export").symlink_to(outside)
    before = snapshot(outside)
    refused(run_cli(*export_args(out, fmt)), out / "export")
    assert snapshot(outside) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_regen_export_refuses_a_format_folder_that_links_out(
    job: Path, outside: Path, fmt: str
) -> None:
    """The finding: `regen export` deleted the link target's `openai/` folder."""
    out = job / "out"
    (out / "export" / fmt).symlink_to(outside / fmt)
    before = snapshot(outside)
    refused(run_cli(*export_args(out, fmt)), out / "export" / fmt)
    assert snapshot(outside) == before
    assert (out / "export" / fmt).is_symlink()


@pytest.mark.parametrize("fmt", FORMATS)
def test_since_last_refuses_a_folder_of_the_export_that_links_out(
    job: Path, outside: Path, fmt: str
) -> None:
    """A part is written beside the earlier ones, which are carried over and the previous
    folder deleted: a link out among them refuses it, and the export stays as it was."""
    out = job / "out"
    assert run_cli(*export_args(out, fmt)).returncode == 0
    train = out / "export" / fmt / "train"
    shutil.rmtree(train)
    train.symlink_to(outside / fmt / "train")
    manifest = (out / "export" / fmt / "manifest.json").read_bytes()
    before = snapshot(outside)
    refused(run_cli(*export_args(out, fmt, "--since-last")), train)
    assert snapshot(outside) == before
    assert (out / "export" / fmt / "manifest.json").read_bytes() == manifest


def test_export_leaves_links_named_as_its_leftovers_and_never_follows_them(
    job: Path, outside: Path
) -> None:
    """regen makes no links: one named as a killed export's temporary or previous folder is
    not its leftover, and neither it nor its target is touched."""
    out = job / "out"
    old = out / "export" / f".openai.old-{DEAD}"
    tmp = out / "export" / f".openai.tmp-{DEAD}"
    old.symlink_to(outside / "openai")
    tmp.symlink_to(outside / "specforge")
    before = snapshot(outside)
    res = run_cli(*export_args(out, "openai"))
    assert res.returncode == 0, res.stderr
    assert old.is_symlink() and tmp.is_symlink()
    assert snapshot(outside) == before
    assert (out / "export" / "openai" / "manifest.json").is_file()


def test_an_export_folder_given_with_to_that_links_out_is_refused(
    job: Path, outside: Path, tmp_path: Path
) -> None:
    """Outside the output directory the folder `--to` names is confined to its parent."""
    to = tmp_path / "exports" / "openai"
    to.parent.mkdir()
    to.symlink_to(outside / "openai")
    before = snapshot(outside)
    refused(run_cli("export", str(job / "out"), "--format", "openai", "--to", str(to)), to)
    assert snapshot(outside) == before


def test_a_link_that_stays_inside_the_output_directory_is_followed(job: Path) -> None:
    out = job / "out"
    (out / "exports-here").mkdir()
    (out / "export" / "openai").symlink_to(out / "exports-here")
    res = run_cli(*export_args(out, "openai"))
    assert res.returncode == 0, res.stderr
    assert (out / "export" / "openai" / "manifest.json").is_file()


def test_regen_report_refuses_a_report_that_links_out(job: Path, outside: Path) -> None:
    out = job / "out"
    (out / "report.html").unlink()
    (out / "report.html").symlink_to(outside / "report.html")
    before = snapshot(outside)
    refused(run_cli("report", str(out)), out / "report.html")
    assert snapshot(outside) == before


def test_a_temporary_file_is_made_new_never_opened_through_a_link(job: Path, outside: Path) -> None:
    """The report goes to `.report.html.tmp` first, then is renamed into place: a link out at
    that name is refused as any other, and one that stays inside is removed, not written
    through."""
    out = job / "out"
    (out / ".report.html.tmp").symlink_to(outside / "report.html")
    before = snapshot(outside)
    refused(run_cli("report", str(out)), out / ".report.html.tmp")
    assert snapshot(outside) == before
    (out / ".report.html.tmp").unlink()
    (out / "mine.txt").write_text("mine\n")
    (out / ".report.html.tmp").symlink_to(out / "mine.txt")
    assert run_cli("report", str(out)).returncode == 0
    assert (out / "mine.txt").read_text() == "mine\n"
    assert not (out / ".report.html.tmp").exists()


@pytest.mark.parametrize("command", ["status", "export", "audit", "report"])
def test_readers_refuse_a_state_db_file_that_links_out(
    job: Path, outside: Path, command: str
) -> None:
    """A reader of a WAL database writes its shared-memory file: through a link, that would
    be someone else's file."""
    out = job / "out"
    (out / "state.db-shm").unlink(missing_ok=True)
    (out / "state.db-shm").symlink_to(outside / "state.db-shm")
    before = snapshot(outside)
    args = [command, str(out), *(FAMILY if command == "audit" else ())]
    refused(run_cli(*args), out / "state.db-shm")
    assert snapshot(outside) == before


def pointed_at(job: Path, base_url: str) -> Path:
    """The copied job's file, its endpoint moved to `base_url` (a new simulator)."""
    text = (job / "job.toml").read_text()
    old = text.split('base_url = "')[1].split('"')[0]
    (job / "job.toml").write_text(text.replace(old, base_url))
    return job / "job.toml"


def link_out(out: Path, name: str, outside: Path) -> Path:
    """`out/name` made a link to the file or folder of that name in `outside`."""
    link = out / name
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    link.unlink(missing_ok=True)
    target = outside / ("openai" if name == "export" else link.name)
    if not target.exists():
        target.write_text("not regen's\n")
    link.symlink_to(target)
    return link


@pytest.mark.parametrize(
    "name", ["export", "export/chat.jsonl", "report.html", "run.log", "run.lock", "state.db-wal"]
)
def test_regen_run_refuses_a_link_out_before_it_sends_anything(
    job: Path, outside: Path, name: str
) -> None:
    """Each path a run writes, the end's export and report included, is checked before the
    first request: with new rows to send, nothing is sent, paid for or written."""
    write_rows(job / "chat.jsonl", chat_rows(30))  # 10 more rows: items to send
    out = job / "out"
    link = link_out(out, name, outside)
    before, db = snapshot(outside), (out / "state.db").read_bytes()
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        res = run_cli("run", str(pointed_at(job, sim.base_url)))
        sent = len(sim.simulator.chat_log())
    refused(res, link)
    assert sent == 0
    assert snapshot(outside) == before
    assert (out / "state.db").read_bytes() == db


def test_regen_plan_refuses_a_run_log_that_links_out(job: Path, outside: Path) -> None:
    out = job / "out"
    link = link_out(out, "run.log", outside)
    before = snapshot(outside)
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        res = run_cli("plan", str(pointed_at(job, sim.base_url)))
    refused(res, link)
    assert snapshot(outside) == before


@pytest.fixture
def held_run(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str], object]]:
    """`regen run` as a process with its first answers given and the rest held."""
    write_rows(tmp_path / "chat.jsonl", chat_rows(20))
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, concurrency=4)
        sim.simulator.hold(after=6)
        run = subprocess.Popen(
            [sys.executable, "-m", "regen", "run", str(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "REGEN_TEST_KEY": SECRET_KEY},
        )
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held >= 1, 60)
            yield tmp_path / "out", run, sim.simulator
        finally:
            sim.simulator.release()
            if run.poll() is None:
                run.kill()
            run.communicate()


def test_an_export_folder_linked_out_during_a_run_is_refused_at_its_end(
    held_run: tuple[Path, subprocess.Popen[str], object], outside: Path
) -> None:
    """The end-of-run export checks its own paths: a link made while the run sends is
    refused then, and every answer stays in state.db."""
    out, run, simulator = held_run
    (out / "export").symlink_to(outside)
    before = snapshot(outside)
    simulator.release()  # type: ignore[attr-defined]
    stdout, stderr = run.communicate(timeout=120)
    refused(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr), out / "export")
    assert snapshot(outside) == before
    status = run_cli("status", str(out), "--json")
    assert '"done": 20' in status.stdout, status.stdout


def test_a_report_linked_out_during_a_run_is_not_written(
    held_run: tuple[Path, subprocess.Popen[str], object], outside: Path
) -> None:
    """The report is a view: the run ends as it would, says the report was not written, and
    the link's target is untouched."""
    out, run, simulator = held_run
    (out / "report.html").symlink_to(outside / "report.html")
    before = snapshot(outside)
    simulator.release()  # type: ignore[attr-defined]
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stdout + stderr
    (line,) = [x for x in stdout.splitlines() if x.startswith("warning: report.html")]
    assert f"{out / 'report.html'} is a link to " in line
    assert snapshot(outside) == before
    assert (out / "export" / "chat.jsonl").is_file()


@pytest.mark.parametrize("where", ["out", "parent", "own files"])
def test_an_export_never_replaces_a_folder_it_did_not_write(
    job: Path, tmp_path: Path, where: str
) -> None:
    """An export replaces its folder whole: `--to` the output directory, a folder that holds
    it, or a folder of someone's own files is refused, and nothing in it is touched (an older
    regen renamed it away and deleted it, state.db with it)."""
    out = job / "out"
    to = {"out": out, "parent": job, "own files": tmp_path / "mine"}[where]
    (tmp_path / "mine" / "notes").mkdir(parents=True)
    (tmp_path / "mine" / "notes" / "todo.txt").write_text("mine\n")
    before = files(to)
    res = run_cli("export", str(out), "--format", "openai", "--to", str(to))
    assert res.returncode == 1, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {to}: holds ") and "nothing was touched" in line, line
    assert files(to) == before
    assert not list(to.parent.glob(f".{to.name}.*"))


def files(folder: Path) -> dict[str, bytes]:
    """The bytes of every file under `folder` but SQLite's -wal and -shm (a reader of
    state.db makes them)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_an_export_goes_into_an_empty_folder_or_over_its_own_last_export(
    job: Path, tmp_path: Path
) -> None:
    to = tmp_path / "empty"
    to.mkdir()
    for _ in range(2):
        res = run_cli("export", str(job / "out"), "--format", "openai", "--to", str(to))
        assert res.returncode == 0, res.stderr
    assert (to / "manifest.json").is_file()
