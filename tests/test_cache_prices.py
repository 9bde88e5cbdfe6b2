"""Prompt caching in the ledger, the gate, the prices and the caps (issue 50): regen records
what the provider read from its cache and wrote to it, prices cache reads and writes where it
computes a cost, and never counts on a discount in a worst case."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from regen.conversation import Usage
from regen.engine.client.account import generation_charge
from regen.engine.client.response import parse_chat_body, parse_choices
from regen.engine.gate import Asked, Gate, doubts
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import query, run_cli, write_job, write_rows

SYSTEM = "You are a careful assistant. " * 40  # a shared prefix of several cache blocks


def conversations(n: int, turns: int) -> list[dict[str, Any]]:
    """`n` rows of `turns` user/assistant turns each, after one long system prompt: each_turn
    sends every turn with the whole history before it, so each prompt repeats the last."""
    rows = []
    for i in range(n):
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"Row {i} turn {t}: " + "go on. " * 30})
            messages.append({"role": "assistant", "content": f"answer {i}.{t} " * 20})
        rows.append({"messages": messages})
    return rows


def multi_turn_job(
    tmp: Path, base_url: str, endpoint: str = 'provider = {only = ["moonshotai"]}', n: int = 6
) -> Path:
    """A job of `n` conversations of 4 turns, each_turn, with `endpoint` lines in [endpoint]
    (by default routed to the one caching provider of the model, Moonshot)."""
    job = write_job(tmp, base_url, concurrency=4)
    write_rows(tmp / "chat.jsonl", conversations(n, 4))
    text = job.read_text().replace('format = "openai"', 'format = "openai"\nmode = "each_turn"')
    job.write_text(text.replace("[generation]", f"{endpoint}\n\n[generation]"))
    return job


def test_a_multi_turn_jobs_ledger_matches_the_providers_cached_bill_to_the_cent(
    tmp_path: Path,
) -> None:
    """Every answer's cached (read) and written prompt tokens are recorded as the provider
    billed them, in the answers and the ledger, and the ledger's total is the sim's bill."""
    config = SimConfig(seed=3, time_scale=0.0, prompt_caching=True, log_bodies=True)
    with sim_in_thread(config) as sim:
        job = multi_turn_job(tmp_path, sim.base_url)
        done = run_cli("run", str(job))
        assert done.returncode == 0, done.stdout + done.stderr
        assert sim.simulator.wait_billed(30)
        log = [e for e in sim.simulator.chat_log() if e.billed]
    out = tmp_path / "out"
    billed = {e.generation_id: e for e in log}
    assert sum(e.cached_tokens for e in log) > 0  # the sim's caches were hit
    rows = query(
        out,
        "SELECT generation_id, prompt_tokens, cached_tokens, cache_write_tokens, cost_usd "
        "FROM ledger",
    )
    assert len(rows) == len(log) == 24
    for gen, prompt, cached, written, cost in rows:
        e = billed[gen]
        assert (prompt, cached, written) == (e.prompt_tokens, e.cached_tokens, e.cache_write_tokens)
        assert cost == pytest.approx(e.cost_usd, abs=1e-12)
    answers = query(out, "SELECT SUM(cached_tokens) FROM results")
    assert answers == [(sum(e.cached_tokens for e in log),)]
    ledger_usd = sum(r[4] for r in rows)
    assert round(ledger_usd, 2) == round(sum(e.cost_usd for e in log), 2)
    status = run_cli("status", str(out), "--json")
    assert '"cached_tokens": ' + str(sum(e.cached_tokens for e in log)) in status.stdout


def test_cache_counts_are_read_from_the_answers_usage() -> None:
    body = (
        b'{"id": "g", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],'
        b' "usage": {"prompt_tokens": 100, "completion_tokens": 5, "cost": 0.001,'
        b' "prompt_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 30}}}'
    )
    usage = parse_chat_body("i", body, status=200, latency_s=0.1).usage
    assert (usage.cached_tokens, usage.cache_write_tokens, usage.junk) == (64, 30, ())


def test_n_choices_share_one_prompts_cache_use_within_each_prompt_share() -> None:
    """vLLM's `n`: one prefill; the shares of its cache use add up and none is more than its
    choice's prompt share (else the gate would refuse a true bill)."""
    body = (
        b'{"choices": [{"message": {"content": "a"}}, {"message": {"content": "b"}},'
        b' {"message": {"content": "c"}}], "usage": {"prompt_tokens": 4,'
        b' "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2,'
        b' "cache_write_tokens": 2}}}'
    )
    results = parse_choices(["a", "b", "c"], body, latency_s=0.1)
    usages = [r.usage for r in results if not isinstance(r, Exception)]
    assert sum(u.cached_tokens for u in usages) == 2
    assert sum(u.cache_write_tokens for u in usages) == 2
    assert all(u.cached_tokens + u.cache_write_tokens <= u.prompt_tokens for u in usages)


@pytest.mark.parametrize(
    ("details", "why"),
    [
        ('{"cached_tokens": -64}', "usage.prompt_tokens_details.cached_tokens = -64"),
        ('{"cached_tokens": "64"}', "usage.prompt_tokens_details.cached_tokens = '64'"),
        ('{"cache_write_tokens": 1e300}', "usage.prompt_tokens_details.cache_write_tokens"),
        ('{"cached_tokens": 90, "cache_write_tokens": 20}', "usage.cached_tokens + cache_write"),
    ],
)
def test_a_junk_cache_count_is_refused_by_the_gate(details: str, why: str) -> None:
    """A cache count that is no amount, or cache use beyond the prompt, is junk like any other
    count: the answer is charged its worst case, and the gate says why."""
    body = (
        '{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 100,'
        f' "completion_tokens": 5, "cost": 0.0001, "prompt_tokens_details": {details}}}}}'
    ).encode()
    usage = parse_chat_body("i", body, status=200, latency_s=0.1).usage
    asked = Asked(max_tokens=64, prompt_bound=200, worst_usd=0.01)
    found = doubts(usage, asked, "usage")
    assert any(d.startswith(why) for d in found), found
    gate = Gate()
    charged = gate.usage(usage, asked, channel="an answer", who="p")
    assert charged.source == "worst" and charged.cost_usd == 0.01
    assert (charged.cached_tokens, charged.cache_write_tokens) == (0, 0)


def test_believed_cache_use_passes_the_gate() -> None:
    usage = Usage(100, 5, cost_usd=0.0001, cached_tokens=64, cache_write_tokens=36)
    assert doubts(usage, Asked(max_tokens=64, prompt_bound=200, worst_usd=0.01), "usage") == []


class _Record:
    """A JsonGetter that answers one `/generation` record."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    async def get_json(self, path: str) -> Any:
        return {"data": self.data}


def test_a_held_requests_generation_record_gives_its_cache_reads() -> None:
    """A bill found by `/generation` (a killed run's request) records its cache reads
    (`native_tokens_cached`); a junk count there is junk for the gate."""
    record = {
        "total_cost": 0.001,
        "tokens_prompt": 900,
        "tokens_completion": 20,
        "native_tokens_prompt": 900,
        "native_tokens_cached": 640,
    }
    usage, _ = asyncio.run(generation_charge(_Record(record), "gen-1")) or (Usage(), None)
    assert (usage.prompt_tokens, usage.cached_tokens, usage.junk) == (900, 640, ())
    bad, _ = asyncio.run(
        generation_charge(_Record({**record, "native_tokens_cached": -1}), "gen-1")
    ) or (Usage(), None)
    assert bad.junk == ("native_tokens_cached = -1",)
