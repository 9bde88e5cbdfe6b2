from __future__ import annotations

from pathlib import Path

import pytest

from regen.config import load_job
from regen.errors import ConfigError
from tests.conftest import run_cli, write_job

MINIMAL = """
[generation]
model = "moonshotai/kimi-k2.5"

[[datasets]]
name = "chat"
path = "chat.jsonl"
"""


def test_minimal_job_gets_the_documented_defaults(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(MINIMAL)
    job = load_job(tmp_path / "job.toml")
    assert job.run.concurrency == 256
    (endpoint,) = job.endpoint_pool
    assert endpoint.api_key_env == "OPENROUTER_API_KEY"
    assert endpoint.base_url == "https://openrouter.ai/api/v1"
    (lane,) = job.lane_list
    assert (lane.name, lane.concurrency, job.lane_max_tokens(lane)) == ("default", 256, 4096)
    assert job.generation.max_tokens == 4096
    assert job.output_path == tmp_path / "out"
    assert job.resolve("chat.jsonl") == tmp_path / "chat.jsonl"


def _error_for(tmp_path: Path, text: str) -> str:
    (tmp_path / "job.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_job(tmp_path / "job.toml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "job.toml"))
    return message


def test_misspelled_nested_field_is_named_with_the_allowed_ones(tmp_path: Path) -> None:
    msg = _error_for(tmp_path, MINIMAL.replace('path = "chat.jsonl"', 'pth = "chat.jsonl"'))
    assert "unknown field 'datasets[0].pth'" in msg
    assert "allowed: name, path, format" in msg
    assert "missing field 'datasets[0].path'" in msg


def test_misspelled_section_is_named(tmp_path: Path) -> None:
    msg = _error_for(tmp_path, MINIMAL + "\n[rnu]\nconcurrency = 3\n")
    assert "unknown field 'rnu'" in msg
    assert "run" in msg


def test_wrong_type_and_range_are_named(tmp_path: Path) -> None:
    msg = _error_for(tmp_path, MINIMAL + '\n[run]\nconcurrency = "many"\n')
    assert "field 'run.concurrency'" in msg
    msg = _error_for(tmp_path, MINIMAL + "\n[run]\nconcurrency = 0\n")
    assert "field 'run.concurrency'" in msg and "greater than or equal to 1" in msg


def test_unknown_format_lists_the_allowed_values(tmp_path: Path) -> None:
    msg = _error_for(tmp_path, MINIMAL + 'format = "parquetish"\n')
    assert "field 'datasets[0].format'" in msg and "'sharegpt'" in msg


def test_invalid_toml_and_missing_file_are_one_line(tmp_path: Path) -> None:
    assert "invalid TOML" in _error_for(tmp_path, "[generation\nmodel = 1")
    with pytest.raises(ConfigError, match="no such job file"):
        load_job(tmp_path / "absent.toml")


def test_duplicate_dataset_names_are_refused(tmp_path: Path) -> None:
    msg = _error_for(tmp_path, MINIMAL + '\n[[datasets]]\nname = "chat"\npath = "b.jsonl"\n')
    assert "repeated: chat" in msg


def test_base_dir_cannot_be_set_from_the_file(tmp_path: Path) -> None:
    assert "unknown field 'base_dir'" in _error_for(tmp_path, 'base_dir = "/"\n' + MINIMAL)


def test_fingerprint_changes_with_sampling_but_not_concurrency(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(MINIMAL)
    base = load_job(tmp_path / "job.toml").fingerprint()
    (tmp_path / "job.toml").write_text(MINIMAL + "\n[run]\nconcurrency = 7\n")
    assert load_job(tmp_path / "job.toml").fingerprint() == base
    text = MINIMAL.replace('kimi-k2.5"', 'kimi-k2.5"\ntemperature = 0.2')
    (tmp_path / "job.toml").write_text(text)
    assert load_job(tmp_path / "job.toml").fingerprint() != base


def test_cli_run_with_misspelled_field_exits_nonzero_with_one_line(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9/api/v1", extra="concurrrency = 4")
    proc = run_cli("run", str(job))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "unknown field 'run.concurrrency'" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_run_without_the_key_names_the_variable(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9/api/v1")
    proc = run_cli("run", str(job), env={"REGEN_TEST_KEY": ""})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: set REGEN_TEST_KEY or name another variable in [endpoint].api_key_env"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://user:secret@127.0.0.1:8000/v1", "must not hold a user name or password"),
        ("http://127.0.0.1:99999/v1", "a port that is not a number from 1 to 65535"),
        ("http://127.0.0.1:0/v1", "port 0"),
        ("http://:8000/v1", "no host name"),
        ("ftp://127.0.0.1/v1", "must start with http:// or https://"),
    ],
)
def test_a_base_url_no_server_can_answer_is_refused_when_the_job_is_read(
    tmp_path: Path, url: str, says: str
) -> None:
    """A `user:pass@` URL ended in an aiohttp traceback, an out-of-range port was retried as
    a connection error: each is a one-line error naming the field, and no secret in it."""
    msg = _error_for(tmp_path, MINIMAL + f'\n[endpoint]\nbase_url = "{url}"\n')
    assert "field 'endpoint.base_url'" in msg and says in msg
    assert "secret" not in msg


def test_an_unreachable_endpoint_is_the_first_error_under_a_cap_and_a_credit_floor(
    tmp_path: Path,
) -> None:
    """Under a dollar cap and a credit floor, an endpoint nothing answers at was reported as a
    price or credit problem, and `regen plan` exited 0 with "$0.00 of $4.00 left"."""
    from tests.conftest import free_port

    port = free_port()  # nothing listens there
    job = write_job(tmp_path, f"http://127.0.0.1:{port}/api/v1")
    job.write_text(
        job.read_text() + "\n[budget]\nmax_cost_usd = 4.0\nstop_when_credits_below = 1.0\n"
    )
    for command in ("run", "plan"):
        proc = run_cli(command, str(job))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(
            f"error: endpoint default: http://127.0.0.1:{port}/api/v1 cannot be reached: "
            f"cannot connect to 127.0.0.1:{port}"
        ), line
        assert "price" not in line and "credit" not in line


LANES = (
    MINIMAL
    + """
[[datasets]]
name = "agent"
path = "agent.jsonl"

[[lanes]]
name = "short"
concurrency = 2000
max_tokens = 10240
datasets = ["chat"]
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = 100
max_tokens = 65536
stream = true
"""
)


def test_lanes_and_their_references_are_checked(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(LANES)
    job = load_job(tmp_path / "job.toml")
    assert [lane.name for lane in job.lane_list] == ["short", "long"]
    assert job.lane_max_tokens(job.lane_list[1]) == 65536
    msg = _error_for(tmp_path, LANES.replace('datasets = ["chat"]', 'datasets = ["chta"]'))
    assert "lanes[0].datasets names unknown dataset 'chta'" in msg
    msg = _error_for(tmp_path, LANES.replace("max_tokens = 65536", "max_tokens = 100"))
    assert "must have a larger max_tokens" in msg
    msg = _error_for(tmp_path, LANES.replace('escalate_to = "long"', 'escalate_to = "short"'))
    assert "escalate_to must name another lane" in msg
    two = LANES + '\n[endpoint]\nbase_url = "http://a"\n[[endpoints]]\nname = "b"\n'
    assert "not both" in _error_for(tmp_path, two)


def test_lane_limits_are_not_part_of_the_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(LANES)
    base = load_job(tmp_path / "job.toml").fingerprint()
    (tmp_path / "job.toml").write_text(LANES.replace("concurrency = 2000", "concurrency = 5"))
    assert load_job(tmp_path / "job.toml").fingerprint() == base


def test_fingerprint_changes_name_each_field_and_ignore_added_datasets(tmp_path: Path) -> None:
    from regen.config import fingerprint_changes

    (tmp_path / "job.toml").write_text(MINIMAL)
    old = load_job(tmp_path / "job.toml").fingerprint_fields()
    changed = (
        MINIMAL.replace('kimi-k2.5"', 'kimi-k2.5"\ntemperature = 0.2\nmax_tokens = 99')
        + '\n[endpoint]\nprovider = { ignore = ["fireworks/fp4"] }\n'
        + '\n[[datasets]]\nname = "more"\npath = "more.jsonl"\n'
    ).replace('path = "chat.jsonl"', 'path = "chat.jsonl"\nformat = "sharegpt"')
    (tmp_path / "job.toml").write_text(changed)
    new = load_job(tmp_path / "job.toml").fingerprint_fields()
    changes = fingerprint_changes(old, new)
    assert changes[0] == 'datasets.chat.format: "openai" -> "sharegpt"'
    assert changes[2] == "generation.temperature: unset -> 0.2"
    assert changes[1].startswith("endpoints: ") and "fireworks/fp4" in changes[1]
    assert len(changes) == 3  # max_tokens is a limit; an added dataset is not a change
    assert fingerprint_changes(new, new) == []


def test_the_readme_job_files_are_valid_jobs() -> None:
    import tomllib

    from regen.config import Job

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```toml")[1:]]
    jobs = [b for b in blocks if "[generation]" in b]
    assert jobs, "the README shows a job file"
    for block in jobs:
        Job.model_validate({**tomllib.loads(block), "base_dir": "."})


def test_reconstruct_family_auto_and_stop(tmp_path: Path) -> None:
    """`auto` reads the model's template, so it needs one; any family name is checked; a
    stop token may be set."""
    message = _error_for(tmp_path, MINIMAL + '[reconstruct]\nfamily = "auto"\n')
    assert "auto" in message and "chat template" in message
    message = _error_for(tmp_path, MINIMAL + '[reconstruct]\nfamily = "glm-9"\n')
    assert "unknown template family 'glm-9'" in message and "regen families" in message
    (tmp_path / "job.toml").write_text(
        MINIMAL + '[reconstruct]\nfamily = "auto"\ntokenizer = "/models/x"\nstop = "<|eot|>"\n'
    )
    job = load_job(tmp_path / "job.toml")
    assert job.reconstruct is not None and job.reconstruct.stop == "<|eot|>"


def test_self_hosted_servers_are_asked_for_token_ids_by_default(tmp_path: Path) -> None:
    text = MINIMAL + (
        '[endpoint]\nbase_url = "http://127.0.0.1:8000/v1"\ndialect = "{d}"\napi_key_env = "X"\n'
    )
    for dialect, plain, streamed in (("vllm", True, True), ("sglang", True, False)):
        (tmp_path / "job.toml").write_text(text.replace("{d}", dialect))
        (endpoint,) = load_job(tmp_path / "job.toml").endpoint_pool
        assert (endpoint.asks_token_ids(False), endpoint.asks_token_ids(True)) == (plain, streamed)
    (tmp_path / "job.toml").write_text(MINIMAL)
    (endpoint,) = load_job(tmp_path / "job.toml").endpoint_pool
    assert not endpoint.asks_token_ids(False)  # OpenRouter returns no ids
