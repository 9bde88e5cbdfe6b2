"""regen against the simulator's vLLM and SGLang dialects (`regen sim --dialect`), streamed and
not, with tool calls and reasoning: the server's own token ids are stored as exact, usage is
never 0, and budgets hold.

The simulator logs the ids it sent (`log_bodies`), so what regen stored is compared with what
the server said, not with anything regen computes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from regen.config import Job, load_job
from regen.events import listening
from regen.run.runner import run_job
from regen.run.summary import RunReport
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from regen.state.answers import unpack_ids
from regen.view.events import TerminalListener
from regen.view.progress import Watch
from tests.conftest import query, run_cli, write_rows

MODEL = "qwen/qwen3-8b"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def rows(n: int) -> list[dict[str, Any]]:
    """Half plain questions, half with a tool the model may call."""
    out = []
    for i in range(n):
        row: dict[str, Any] = {
            "messages": [
                {"role": "user", "content": f"Question {i}: what is the weather in city {i}?"},
                {"role": "assistant", "content": "old answer"},
            ]
        }
        if i % 2:
            row["tools"] = [WEATHER]
        out.append(row)
    return out


def job_file(
    tmp: Path, base_url: str, dialect: str, *, stream: bool, token_ids: bool, extra: str = ""
) -> Path:
    write_rows(tmp / "chat.jsonl", rows(24))
    job = tmp / "job.toml"
    job.write_text(
        f"""
[job]
output_dir = "out"

[endpoint]
base_url = "{base_url}"
dialect = "{dialect}"
api_key_env = "REGEN_NO_KEY_NEEDED"
token_ids = {str(token_ids).lower()}

[generation]
model = "{MODEL}"
max_tokens = 400

[run]
concurrency = 8
progress_interval_s = 0.5

[[lanes]]
name = "main"
stream = {str(stream).lower()}

[[datasets]]
name = "chat"
path = "chat.jsonl"
{extra}
"""
    )
    return job


def watched_run(job: Job) -> tuple[RunReport, str]:
    """Run the job with the terminal listening, as `regen run` does; the report and what the
    terminal showed."""
    out = io.StringIO()
    console = Console(file=out, width=200)
    with listening(TerminalListener(console)):
        report = run_job(job, shown=Watch(console))
    return report, out.getvalue()


def run(job: Path) -> str:
    report, out = watched_run(load_job(job))
    assert report.failed == 0 and not report.stop_reason, out
    return out


def sent_ids(log: list[Any]) -> dict[str, tuple[list[int], list[int]]]:
    """What the server sent, by answer id: (prompt ids, completion ids)."""
    return {
        e.generation_id: (e.prompt_ids, e.completion_ids)
        for e in log
        if e.status == 200 and e.generation_id is not None
    }


CASES = [
    ("vllm", False, True),
    ("vllm", True, True),
    ("vllm", True, False),
    ("sglang", False, True),
    ("sglang", True, False),
]


@pytest.mark.parametrize(("dialect", "stream", "token_ids"), CASES)
def test_a_self_hosted_run_stores_the_servers_ids_and_usage(
    tmp_path: Path, dialect: str, stream: bool, token_ids: bool
) -> None:
    config = SimConfig(
        dialect=dialect,  # type: ignore[arg-type]
        served_model=MODEL,
        seed=3,
        time_scale=0.0,
        log_bodies=True,
    )
    with sim_in_thread(config) as sim:
        run(job_file(tmp_path, sim.base_url, dialect, stream=stream, token_ids=token_ids))
        log = list(sim.simulator.chat_log())
    bodies = [e.body for e in log if e.body is not None]
    assert bodies and all(b["model"] == MODEL for b in bodies)
    if stream:  # usage is asked for where the servers send it only when asked
        assert all(b["stream_options"] == {"include_usage": True} for b in bodies)
    assert all("provider" not in b for b in bodies)
    results = query(
        tmp_path / "out",
        "SELECT generation_id, prompt_tokens, completion_tokens, reasoning_tokens, cost_usd, "
        "prompt_token_ids, completion_token_ids, usage_source, tool_calls, reasoning "
        "FROM results",
    )
    assert len(results) == 24
    sent = sent_ids(log)
    with_calls = sum(1 for r in results if r[8])
    assert with_calls, "the seeded run has answers with tool calls"
    assert all(r[9] for r in results), "every answer keeps its reasoning"
    for gen_id, prompt, completion, _, cost, p_ids, c_ids, source, _, _ in results:
        assert prompt > 0 and completion > 0 and source is None  # the server's own usage
        assert cost is None  # a self-hosted server bills nothing and no price is set
        server_prompt, server_completion = sent[gen_id]
        assert (prompt, completion) == (len(server_prompt), len(server_completion))
        if token_ids:
            assert unpack_ids(p_ids) == server_prompt
            assert unpack_ids(c_ids) == server_completion
        else:
            assert p_ids is None and c_ids is None


def test_a_stream_without_usage_is_counted_from_the_servers_ids(tmp_path: Path) -> None:
    """A server that sends no usage (here: the job turns it off) never leaves 0 tokens."""
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=4, time_scale=0.0, log_bodies=True)
    extra_body = "extra_body = { stream_options = { include_usage = false } }"
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=True, token_ids=True)
        job.write_text(
            job.read_text().replace("token_ids = true", f"token_ids = true\n{extra_body}")
        )
        report = run_job(load_job(job))
        sent = sent_ids(sim.simulator.chat_log())
    assert report.counted_usage == {("chat", "ids"): 24}
    results = query(
        tmp_path / "out", "SELECT generation_id, completion_tokens, usage_source FROM results"
    )
    assert {r[2] for r in results} == {"ids"}
    for gen_id, completion, _ in results:
        assert completion == len(sent[gen_id][1]) > 0


def test_a_token_budget_holds_on_a_vllm_server(tmp_path: Path) -> None:
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=5, time_scale=0.0)
    with sim_in_thread(config) as sim:
        job = job_file(
            tmp_path, sim.base_url, "vllm", stream=True, token_ids=True, extra="token_budget = 2000"
        )
        text = job.read_text().replace('name = "main"', 'name = "main"\nconcurrency = 2')
        job.write_text(text)
        out = run(job)
    spent = query(tmp_path / "out", "SELECT SUM(completion_tokens), COUNT(*) FROM results")[0]
    assert 2000 <= spent[0] < 2000 + 2 * 400, out  # at most what was in flight over it
    assert spent[1] < 24


FAMILY_MODELS = [
    ("qwen/qwen3-8b", "qwen3"),
    ("moonshotai/kimi-k2.5", "kimi-k2.5"),
    ("moonshotai/kimi-k2", "kimi-k2"),
    ("deepseek/deepseek-chat-v3", "deepseek-v3"),
    ("deepseek/deepseek-r1", "deepseek-r1"),
    ("z-ai/glm-4.5", "glm-4.5"),
    ("openai/gpt-oss-120b", "gpt-oss"),
    ("sim/chatml", "chatml"),
    ("z-ai/glm-4.7", "glm-4.7"),
    ("minimax/minimax-m2", "minimax-m2"),
    ("qwen/qwen3-coder", "qwen3-coder"),
    ("qwen/qwen3.5-397b-a17b", "qwen3.5"),
    ("moonshotai/kimi-k3", "kimi-k3"),
    ("meta-llama/llama-4-maverick", "llama4"),
]


def served_run(tmp: Path, model: str, family: str, *, stream: bool = False) -> Path:
    """A vLLM run of `model` with token ids and `[reconstruct]`; its output folder."""
    config = SimConfig(dialect="vllm", served_model=model, seed=6, time_scale=0.0)
    with sim_in_thread(config) as sim:
        job = job_file(tmp, sim.base_url, "vllm", stream=stream, token_ids=True)
        text = job.read_text().replace(MODEL, model)
        job.write_text(text + f'\n[reconstruct]\nfamily = "{family}"\ntokenizer = "sim"\n')
        run(job)
    return tmp / "out"


@pytest.mark.parametrize(("model", "family"), FAMILY_MODELS)
def test_the_servers_ids_prove_each_familys_rebuild(
    tmp_path: Path, model: str, family: str
) -> None:
    """The rebuild of every answer (template for the prompt, grammar for the completion)
    equals the ids the server generated, token for token."""
    from regen.outputs.audit import audit, audit_json

    out = served_run(tmp_path, model, family)
    overall = audit_json(audit(out, include_truncated=True)[0])["overall"]
    cut = query(out, "SELECT COUNT(*) FROM results WHERE finish_reason = 'length'")[0][0]
    assert overall["server_ids_checked"] == 24
    assert overall["server_ids_divergences"] == [], overall["server_ids_divergences"]
    assert overall["server_ids_match_share"] == 1.0
    assert overall["exact_ids"] == 24 and cut < 24


def test_a_wrong_grammar_is_caught_by_the_servers_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One newline too many after Qwen3's reasoning: the audit names the first token where
    the rebuild leaves the server's ids, and the answer's exact ids still export."""
    from regen.outputs.audit import audit, audit_json
    from regen.reconstruct import Target

    out = served_run(tmp_path, MODEL, "qwen3")
    real = Target.completion_text

    def wrong(self: Target, row: Any, prompt: str, prefill: str = "") -> str:
        return real(self, row, prompt, prefill).replace("</think>\n\n", "</think>\n\n\n", 1)

    monkeypatch.setattr(Target, "completion_text", wrong)
    overall = audit_json(audit(out)[0])["overall"]
    assert overall["server_ids_checked"] > 0
    assert overall["server_ids_match_share"] == 0.0
    first = overall["server_ids_divergences"][0]["first_divergence"]
    assert first.startswith("completion token ") and "server" in first, first
    assert overall["problems"]["rebuild_differs_from_server"] == overall["server_ids_checked"]


def test_gpu_hour_prices_add_up_to_the_servers_busy_time_and_a_cap_stops_it(
    tmp_path: Path,
) -> None:
    """Each answer is charged the server's busy time since the previous one at gpus x
    $/GPU-hour: the charges add up to no more than the run's wall time at that rate and no
    less than its longest request. A job cap stops sending once the charges reach it."""
    import time

    rate_per_s = 4 * 36.0 / 3600  # 4 GPUs at $36 an hour: $0.04 a second
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=8, time_scale=0.05)
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=False)
        text = job.read_text().replace(
            "token_ids = false", "token_ids = false\nusd_per_gpu_hour = 36.0\ngpus = 4"
        )
        job.write_text(text)
        started = time.monotonic()
        run(job)
        wall = time.monotonic() - started
    costs = query(tmp_path / "out", "SELECT cost_usd, latency_s FROM results")
    assert len(costs) == 24 and all(c > 0 for c, _ in costs)
    total = sum(c for c, _ in costs)
    assert max(lat for _, lat in costs) * rate_per_s <= total <= wall * rate_per_s

    capped = tmp_path / "capped"
    capped.mkdir()
    cap = total / 3
    with sim_in_thread(config) as sim:
        job = job_file(capped, sim.base_url, "vllm", stream=False, token_ids=False)
        text = job.read_text().replace(
            "token_ids = false", "token_ids = false\nusd_per_gpu_hour = 36.0\ngpus = 4"
        )
        text = text.replace('name = "main"', 'name = "main"\nconcurrency = 2')
        job.write_text(text + f"\n[budget]\nmax_cost_usd = {cap}\n")
        report, out = watched_run(load_job(job))
    assert report.budget_stop, out
    spent = query(capped / "out", "SELECT SUM(cost_usd), COUNT(*) FROM results")[0]
    assert spent[1] < 24
    # Past the cap by at most what the requests in flight at the stop took to finish.
    longest = max(lat for _, lat in costs)
    assert cap <= spent[0] <= cap + longest * rate_per_s * 2, (spent, cap)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_self_hosted_run_rides_out_the_servers_faults(tmp_path: Path, dialect: str) -> None:
    """5xx, connections cut mid-answer, mid-stream errors and stalls: every item ends done,
    with the ids and usage of the attempt that succeeded."""
    faults = SimFaults(http_5xx=0.1, http_5xx_codes=[500, 503], reset=0.1, midstream_error=0.1,
                       stall=0.05, stall_s=0.5)  # fmt: skip
    config = SimConfig(
        dialect=dialect,  # type: ignore[arg-type]
        served_model=MODEL,
        seed=9,
        time_scale=0.0,
        log_bodies=True,
        faults=faults,
    )
    with sim_in_thread(config) as sim:
        stream = dialect == "vllm"
        job = job_file(tmp_path, sim.base_url, dialect, stream=stream, token_ids=True)
        text = job.read_text().replace("progress_interval_s = 0.5", "progress_interval_s = 0.5\n"
                                       "idle_timeout_s = 0.2")  # fmt: skip
        job.write_text(text)
        run(job)
        log = list(sim.simulator.chat_log())
    assert {f for e in log for f in e.faults} >= {"reset", "midstream_error"}
    sent = sent_ids(log)
    rows = query(
        tmp_path / "out",
        "SELECT generation_id, completion_tokens, completion_token_ids FROM results",
    )
    assert len(rows) == 24
    for gen_id, completion, ids in rows:
        assert unpack_ids(ids) == sent[gen_id][1] and completion == len(sent[gen_id][1])


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_prompts_samples_go_as_one_request_with_n(tmp_path: Path, dialect: str) -> None:
    """samples = 4 on a vLLM or SGLang server: one request with n = 4 per prompt (one
    prefill), each choice stored as its own sample with the server's own ids and its share of
    the bill; without batching, four requests and four prefills."""
    config = SimConfig(
        dialect=dialect,  # type: ignore[arg-type]
        served_model=MODEL,
        seed=3,
        time_scale=0.0,
        log_bodies=True,
    )
    prefills = {}
    for batched in (True, False):
        folder = tmp_path / str(batched)
        folder.mkdir()
        with sim_in_thread(config) as sim:
            job = job_file(folder, sim.base_url, dialect, stream=False, token_ids=True)
            text = job.read_text().replace("max_tokens = 400", "max_tokens = 400\nsamples = 4")
            if not batched:
                text = text.replace(
                    "token_ids = true", "token_ids = true\nsamples_in_one_request = false"
                )
            job.write_text(text)
            run(job)
            log = [e for e in sim.simulator.chat_log() if e.status == 200]
        prefills[batched] = sum(e.prompt_tokens for e in log)
        results = query(
            folder / "out",
            "SELECT i.conversation_id, i.sample, r.generation_id, r.prompt_tokens, "
            "r.completion_tokens, r.prompt_token_ids, r.completion_token_ids, r.settings "
            "FROM results r JOIN items i ON i.id = r.item_id",
        )
        assert len(results) == 24 * 4
        if not batched:
            assert len(log) == 96 and all(e.choices == 1 for e in log)
            continue
        assert len(log) == 24 and all(e.choices == 4 for e in log)  # one request a prompt
        by_gen = {e.generation_id: e for e in log}
        per_prompt: dict[str, list[Any]] = {}
        for cid, sample, gen, prompt, completion, p_ids, c_ids, settings in results:
            per_prompt.setdefault(cid, []).append((sample, gen, prompt, completion, settings))
            e = by_gen[gen]
            sent = json.loads(settings)
            assert sent["n"] == 4 and 0 <= sent["choice"] < 4
            # Each sample holds its own choice's ids, exactly as the server sent them.
            assert unpack_ids(c_ids) == e.choice_ids[sent["choice"]]
            assert unpack_ids(p_ids) == e.prompt_ids and completion == len(unpack_ids(c_ids))
        for samples in per_prompt.values():
            assert sorted(s[0] for s in samples) == [0, 1, 2, 3]
            assert len({s[1] for s in samples}) == 1  # one request
            # The prompt's tokens are billed once, shared out among its samples.
            assert sum(s[2] for s in samples) == by_gen[samples[0][1]].prompt_tokens
    assert prefills[True] * 4 == prefills[False]


def test_the_audit_of_batched_samples_holds_each_to_its_share_of_the_prompt(
    tmp_path: Path,
) -> None:
    config = SimConfig(dialect="vllm", served_model=MODEL, seed=3, time_scale=0.0)
    with sim_in_thread(config) as sim:
        job = job_file(tmp_path, sim.base_url, "vllm", stream=False, token_ids=True)
        job.write_text(job.read_text().replace("max_tokens = 400", "max_tokens = 400\nsamples = 3"))
        run(job)
    res = run_cli("audit", str(tmp_path / "out"), "--family", "qwen3", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    [(whole,)] = query(
        tmp_path / "out", "SELECT count(*) FROM results WHERE finish_reason != 'length'"
    )
    assert report["overall"]["samples"] == whole > 60
    assert report["overall"]["prompt_mean_abs_diff"] == 0  # no sample held to its share
