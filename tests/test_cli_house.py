"""Issue 49's small words: `regen --help` opens with what regen does for its user, and
`regen schema` prints a JSON Schema that the job files regen ships pass and a wrong one fails."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_help_opens_with_what_regen_does_and_ends_with_the_exit_codes() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[2].startswith("Regenerate the answers of prompt datasets"), lines[:4]
    assert "parse arguments" not in proc.stdout  # the module's docstring is for its readers
    codes = re.findall(r"\b(\d+) [a-z]", proc.stdout.split("exit codes:")[1])
    assert codes == ["0", "1", "2", "3", "4", "5", "130"]


def _schema() -> dict[str, Any]:
    proc = run_cli("schema")
    assert proc.returncode == 0, proc.stderr
    schema: dict[str, Any] = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _shipped_jobs() -> list[dict[str, Any]]:
    """The demo's job file and the README's whole job files (those with datasets)."""
    demo = ROOT / "src" / "regen" / "demo" / "job.toml"
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    jobs = [tomllib.loads(demo.read_text())]
    jobs += [tomllib.loads(b) for b in blocks if "[[datasets]]" in b]
    return jobs


def test_the_schema_passes_the_job_files_regen_ships() -> None:
    validator = jsonschema.Draft202012Validator(_schema())
    jobs = _shipped_jobs()
    assert len(jobs) >= 2
    for job in jobs:
        assert list(validator.iter_errors(job)) == []


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"base_dir": "/"}, "Additional properties are not allowed ('base_dir'"),
        ({"lanes": [{"name": "a", "concurency": 4}]}, "('concurency' was unexpected)"),
        ({"endpoint": {"dialect": "vllm2"}}, "'vllm2' is not one of"),
        ({"endpoint": {"weight": 0}}, "0 is less than or equal to the minimum of 0"),
    ],
)
def test_the_schema_refuses_what_a_job_file_may_not_say(change: dict[str, Any], error: str) -> None:
    job = {**_shipped_jobs()[0], **change}
    found = list(jsonschema.Draft202012Validator(_schema()).iter_errors(job))
    errors = [e.message for top in found for e in [top, *_within(top)]]
    assert any(error in e for e in errors), errors


def _within(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors under an `anyOf` (a table or nothing) that said why each choice failed."""
    return [e for sub in error.context or [] for e in [sub, *_within(sub)]]
