"""Servers that differ from what regen asks of them (issue 48): a field the server refuses
(`return_token_ids` answered with 422), `n` ignored, and no `/health`. Each is learned once
per endpoint, said once in a line naming the setting, and the run goes on without it:
nothing stops, nothing is paid twice, no attempt fails over it after the first answer."""

from __future__ import annotations

import json
from pathlib import Path

from regen.config import load_job
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from tests.conftest import query, run_cli
from tests.engine.test_selfhosted import MODEL, job_file, watched_run


def run_all(job: Path) -> str:
    """Run the job with 4 requests at most in flight; fail on any failed item or stop."""
    job.write_text(job.read_text().replace('name = "main"', 'name = "main"\nconcurrency = 4'))
    report, out = watched_run(load_job(job))
    assert report.failed == 0 and not report.stop_reason, out
    return out


def failed_attempts(out: Path) -> int:
    """Attempts that failed, whatever their class."""
    rows = query(out, "SELECT COUNT(*) FROM attempts WHERE failure_class IS NOT NULL")
    return int(rows[0][0])


def test_a_refused_return_token_ids_is_learned_once_and_the_run_goes_on(tmp_path: Path) -> None:
    config = SimConfig(
        dialect="vllm",
        served_model=MODEL,
        seed=3,
        time_scale=0.0,
        log_bodies=True,
        refuse_fields=["return_token_ids"],
    )
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=True)
        text = run_all(job)
        log = list(sim.simulator.chat_log())
    said = [line for line in text.splitlines() if "return_token_ids" in line]
    assert len(said) == 1 and "[endpoint] token_ids" in said[0], text
    refused = [e for e in log if e.status == 422]
    answered = [e for e in log if e.status == 200]
    assert 1 <= len(refused) <= 4  # at most the requests already in flight when it was learned
    assert len(answered) == 24 and all("return_token_ids" not in e.body for e in answered)
    assert not any(e.billed for e in refused)
    rows = query(tmp_path / "out", "SELECT prompt_token_ids, completion_token_ids FROM results")
    assert len(rows) == 24 and all(p is None and c is None for p, c in rows)
    assert failed_attempts(tmp_path / "out") == 0


def test_a_server_that_ignores_n_is_learned_once_and_each_sample_is_sent_alone(
    tmp_path: Path,
) -> None:
    config = SimConfig(
        dialect="vllm", served_model=MODEL, seed=3, time_scale=0.0, log_bodies=True, ignore_n=True
    )
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=True)
        job.write_text(job.read_text().replace("max_tokens = 400", "max_tokens = 400\nsamples = 4"))
        text = run_all(job)
        log = [e for e in sim.simulator.chat_log() if e.status == 200]
    said = [line for line in text.splitlines() if "ignores n" in line]
    assert len(said) == 1 and "samples_in_one_request" in said[0], text
    asked_n = [e for e in log if e.body.get("n", 1) > 1]
    assert 1 <= len(asked_n) <= 4  # learned from the first answers: the rest go one a request
    rows = query(tmp_path / "out", "SELECT COUNT(*), COUNT(DISTINCT generation_id) FROM results")
    assert rows == [(96, 96)]  # every sample its own answer, none paid twice
    assert len(log) == 96  # each answer was generated once: no sample was sent again
    assert failed_attempts(tmp_path / "out") == 0


def test_a_server_without_health_is_probed_with_a_real_request(tmp_path: Path) -> None:
    """A 503 drains the server; it has no `/health`, so regen probes it with a minimal chat
    request and takes it back once that is answered, well within pool_down_timeout_s."""
    config = SimConfig(
        dialect="vllm",
        served_model=MODEL,
        seed=3,
        time_scale=0.0,
        log_bodies=True,
        health_route=False,
        faults=SimFaults(http_5xx=0.2, http_5xx_codes=[503]),
    )
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=True)
        job.write_text(
            job.read_text().replace(
                "progress_interval_s = 0.5", "progress_interval_s = 0.5\npool_down_timeout_s = 20"
            )
        )
        run_all(job)
        log = list(sim.simulator.chat_log())
    assert query(tmp_path / "out", "SELECT COUNT(*) FROM results") == [(24,)]
    probes = [e for e in log if e.body and e.body.get("max_tokens") == 1]
    assert probes, "the server was probed with a real request"


def test_text_a_server_inserts_before_the_content_is_said_not_failed(tmp_path: Path) -> None:
    """With thinking off, the server answers `\\n\\n` before the content; its ids hold none of
    it, and the rebuild equals them: the audit fails no answer and says which text."""
    config = SimConfig(
        dialect="vllm",
        served_model=MODEL,
        seed=3,
        time_scale=0.0,
        insert_without_thinking="\n\n",
    )
    with sim_in_thread(config) as sim:
        job = job_file(
            tmp_path,
            sim.base_url,
            "vllm",
            stream=False,
            token_ids=True,
            extra="",
        )
        text = job.read_text().replace(
            "token_ids = true",
            "token_ids = true\nextra_body = { chat_template_kwargs = { enable_thinking = false } }",
        )
        job.write_text(text)
        run_all(job)
    # Answers cut at max_tokens are left out of the audit.
    sql = "SELECT content FROM results WHERE content != '' AND finish_reason != 'length'"
    contents = query(tmp_path / "out", sql)
    assert contents and all(c.startswith("\n\n") for (c,) in contents)
    res = run_cli("audit", str(tmp_path / "out"), "--family", "qwen3", "--json")
    data = json.loads(res.stdout)["overall"]
    assert data["failed"] == 0 and "reparse_mismatch" not in data["problems"], res.stdout
    assert data["problems"]["server_inserted_text"] == len(contents)
    assert "the server inserted '\\n\\n' before the content" in data["notes"][0]["note"]
