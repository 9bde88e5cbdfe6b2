"""A key with a line end or another control character in its variable is one line naming the
variable and what is wrong, never the key, and nothing is sent; so is such a header."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.sim import RunningSim
from tests.conftest import add_to_section, run_cli, write_job

SECRET = "sk-or-v1-0123456789abcdef"
BAD = [
    (SECRET[:9] + "\r\n" + SECRET[9:], "a carriage return (CR) at character 10"),
    (SECRET[:9] + "\nX-Injected: 1", "a line feed (LF) at character 10"),
    (SECRET[:5] + "\x1b[2J" + SECRET[5:], "a control character (U+001B) at character 6"),
    (SECRET + "\x7fx", "a control character (U+007F) at character 26"),
    (SECRET[:3] + "\tb", "a tab at character 4"),
]


def _job(tmp: Path, url: str, endpoint_extra: str = "") -> Path:
    return add_to_section(write_job(tmp, url, rows=3), "endpoint", endpoint_extra)


def _assert_refused(proc: object, variable: str, what: str, setting: str) -> None:
    import subprocess

    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == (
        f"error: {variable} (named by [endpoint].{setting}) holds {what}: a key cannot hold "
        "control characters; set it again (a copy may have brought a line end or a terminal "
        "code along)\n"
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert SECRET[9:] not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("key", "what"), BAD, ids=["crlf", "lf", "esc", "del", "tab"])
def test_an_api_key_with_a_control_character_is_one_line(
    sim: RunningSim, tmp_path: Path, key: str, what: str
) -> None:
    job = _job(tmp_path, sim.base_url)
    proc = run_cli("run", str(job), env={"REGEN_TEST_KEY": key})
    _assert_refused(proc, "REGEN_TEST_KEY", what, "api_key_env")
    assert sim.simulator.chat_log() == []


def test_a_management_key_with_a_control_character_is_one_line(
    sim: RunningSim, tmp_path: Path
) -> None:
    job = _job(tmp_path, sim.base_url, 'management_key_env = "REGEN_TEST_MGMT"')
    key, what = BAD[0]
    proc = run_cli("run", str(job), env={"REGEN_TEST_MGMT": key})
    _assert_refused(proc, "REGEN_TEST_MGMT", what, "management_key_env")
    assert sim.simulator.chat_log() == []


@pytest.mark.parametrize("command", ["plan", "providers"])
def test_other_commands_that_read_the_key_refuse_it_alike(
    sim: RunningSim, tmp_path: Path, command: str
) -> None:
    job = _job(tmp_path, sim.base_url)
    key, what = BAD[1]
    args = ["plan", str(job)] if command == "plan" else ["providers", "m/x", "--job", str(job)]
    proc = run_cli(*args, env={"REGEN_TEST_KEY": key})
    _assert_refused(proc, "REGEN_TEST_KEY", what, "api_key_env")


def test_a_line_end_a_copy_adds_around_the_key_is_still_taken_off(
    sim: RunningSim, tmp_path: Path
) -> None:
    job = _job(tmp_path, sim.base_url)
    proc = run_cli("run", str(job), env={"REGEN_TEST_KEY": f"  {SECRET}\r\n"})
    assert proc.returncode == 0, proc.stderr
    assert {e.authorization for e in sim.simulator.chat_log()} == {f"Bearer {SECRET}"}


def test_a_header_with_a_line_end_in_the_job_file_is_one_line(
    sim: RunningSim, tmp_path: Path
) -> None:
    job = _job(tmp_path, sim.base_url, 'headers = { "X-Title" = "a\\r\\nX-Evil: 1" }')
    proc = run_cli("run", str(job))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: {job}: field 'endpoint.headers': header X-Title holds a carriage return (CR) "
        "at character 2: a header cannot hold control characters\n"
    )
    assert sim.simulator.chat_log() == []
