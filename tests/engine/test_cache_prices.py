"""Prompt caching in the ledger, the gate, the prices and the caps (issue 50): regen records
what the provider read from its cache and wrote to it, prices cache reads and writes where it
computes a cost, and never counts on a discount in a worst case."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest

from regen.config import EndpointConfig, GenerationConfig
from regen.conversation import Message, Request, Usage
from regen.engine.budget import Prices, billed_above, configured_prices, fill_cost
from regen.engine.client.account import generation_charge
from regen.engine.client.body import chat_body
from regen.engine.client.response import parse_chat_body, parse_choices
from regen.engine.gate import Asked, Gate, doubts, listing
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import kill_at, query, run_cli, write_job, write_rows
from tests.lying_proxy import REMOVED, Lie, lying_proxy

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


def test_without_usage_cost_the_ledger_prices_cache_reads_at_the_listed_cache_price(
    tmp_path: Path,
) -> None:
    """A provider (or proxy) that sends no `usage.cost`: the cost comes from the catalogue's
    prices, its cached tokens at `input_cache_read` (Moonshot's 0.25x), and still equals the
    provider's bill; priced in full it was a third over it."""
    config = SimConfig(seed=5, time_scale=0.0, prompt_caching=True, log_bodies=True)
    with (
        sim_in_thread(config) as sim,
        lying_proxy(sim.base_url, [Lie("chat", "cost", REMOVED)]) as proxy,
    ):
        job = multi_turn_job(tmp_path, proxy.base_url)
        done = run_cli("run", str(job))
        assert done.returncode == 0, done.stdout + done.stderr
        assert sim.simulator.wait_billed(30)
        log = [e for e in sim.simulator.chat_log() if e.billed]
    assert sum(e.cached_tokens for e in log) > 0
    billed = {e.generation_id: e.cost_usd for e in log}
    rows = query(tmp_path / "out", "SELECT generation_id, cost_usd FROM ledger")
    assert len(rows) == len(log)
    for gen, cost in rows:
        assert cost == pytest.approx(billed[gen], rel=1e-9)


def test_a_cost_from_prices_charges_cache_reads_and_writes_at_their_prices() -> None:
    prices = Prices(1e-6, 4e-6, cache_read=0.1e-6, cache_write=1.25e-6)
    usage = Usage(1000, 10, cached_tokens=600, cache_write_tokens=300)
    expected = 100 * 1e-6 + 600 * 0.1e-6 + 300 * 1.25e-6 + 10 * 4e-6
    assert fill_cost(usage, prices).cost_usd == pytest.approx(expected)
    # A bill at the cache prices is no bill above the prices (they are not raised).
    assert billed_above(prices, fill_cost(usage, prices)) is None
    # Without cache prices, a cached token costs the prompt price.
    assert fill_cost(usage, Prices(1e-6, 4e-6)).cost_usd == pytest.approx(1000e-6 + 40e-6)


def test_a_worst_case_never_assumes_a_discount_and_counts_a_dear_write() -> None:
    """The lease and every cap's worst case price every prompt token at the dearer of the
    prompt and cache write prices, whatever the cache read price."""
    assert Prices(1e-6, 4e-6, cache_read=0.1e-6).cost(1000, 10) == pytest.approx(1040e-6)
    dear_writes = Prices(1e-6, 4e-6, cache_read=0.1e-6, cache_write=1.25e-6)
    assert dear_writes.cost(1000, 10) == pytest.approx(1250e-6 + 40e-6)


def test_a_listed_cache_price_above_the_prompt_price_is_not_believed_and_said_once() -> None:
    found = listing(
        "m/x",
        [
            ("honest", "1e-6", "4e-6", "2.5e-7", None),
            ("odd", "1e-6", "4e-6", "3e-6", None),
            ("junk", "1e-6", "4e-6", "0.2e-6", "-1"),
            ("plain", "5e-7", "2e-6"),
        ],
    )
    # `odd`'s read is taken at its prompt price, the dearest read a cached token may cost.
    assert (found.cache_read, found.cache_write) == (1e-6, None)
    assert [who for who, _ in found.cache_refused] == ["odd", "junk"]
    gate = Gate()
    gate.prices("m/x", found, channel="/models/m/x/endpoints")
    lines = gate.take_lines()
    assert len(lines) == 2
    assert "pricing.input_cache_read = '3e-6' (above the prompt price 1e-06)" in lines[0]
    assert "pricing.input_cache_write = '-1'" in lines[1]
    honest = listing("m/x", [("a", "1e-6", "4e-6", "2.5e-7", "1.25e-6"), ("b", "5e-7", "2e-6")])
    assert (honest.cache_read, honest.cache_write, honest.cache_refused) == (2.5e-7, 1.25e-6, ())


def test_job_file_cache_prices_are_read_and_checked(tmp_path: Path) -> None:
    def endpoint(lines: str) -> EndpointConfig:
        return EndpointConfig.model_validate(tomllib.loads(lines))

    e = endpoint(
        "prompt_usd_per_mtok = 1.0\ncompletion_usd_per_mtok = 4.0\n"
        "cache_read_usd_per_mtok = 0.1\ncache_write_usd_per_mtok = 1.25"
    )
    p = configured_prices(e)
    assert p is not None and (p.cache_read, p.cache_write) == pytest.approx((0.1e-6, 1.25e-6))
    with pytest.raises(ValueError, match="a cache read is a discount"):
        endpoint(
            "prompt_usd_per_mtok = 1.0\ncompletion_usd_per_mtok = 4.0\ncache_read_usd_per_mtok = 2"
        )
    with pytest.raises(ValueError, match="give prompt_usd_per_mtok"):
        endpoint("cache_read_usd_per_mtok = 0.1")


@pytest.mark.slow
def test_the_job_cap_holds_across_kill_9_with_caching_on(tmp_path: Path) -> None:
    """With prompt caching on and cache prices listed, a multi-turn job killed with requests
    in flight, then run to its end, is billed no more than its dollar cap: the leases and
    holds count every prompt token at the full price, whatever the caches save."""
    cap = 0.2
    config = SimConfig(seed=4, time_scale=0.3, prompt_caching=True, log_bodies=True)
    with sim_in_thread(config) as sim:
        job = multi_turn_job(tmp_path, sim.base_url, n=120)
        text = job.read_text().replace("concurrency = 4", "concurrency = 32\ntimeout_s = 4")
        job.write_text(text + f"\n[budget]\nmax_cost_usd = {cap}\n")
        kills = kill_at(job, "commit:10", 3)
        final = run_cli("run", str(job), timeout=120)
        assert sim.simulator.wait_billed(60)
        log = [e for e in sim.simulator.chat_log() if e.billed]
    assert kills >= 2, kills
    assert final.returncode in (0, 4), final.stdout + final.stderr
    assert "dollar cap" in final.stdout
    billed = sum(e.cost_usd for e in log)
    assert sum(e.cached_tokens for e in log) > 0
    assert 0.5 * cap < billed <= cap + 1e-9, billed
    ((ledger, cached),) = query(
        tmp_path / "out", "SELECT SUM(cost_usd), SUM(cached_tokens) FROM ledger"
    )
    assert ledger <= cap + 1e-9 and cached > 0


def sent_bodies(log: list[Any]) -> list[dict[str, Any]]:
    return [e.body for e in log if e.body is not None and e.path.endswith("/chat/completions")]


@pytest.mark.parametrize(
    ("endpoint", "sent"),
    [
        ("", True),
        ("session_id = false", False),
        ('provider = {order = ["moonshotai"]}', False),
    ],
)
def test_each_conversation_carries_one_session_id_on_openrouter(
    tmp_path: Path, endpoint: str, sent: bool
) -> None:
    """Every turn of a conversation goes with the same `session_id` (OpenRouter keeps it on
    the provider that holds its cache), each conversation its own, holding none of its text;
    none is sent when the job turns it off or sets `provider.order` (no sticky routing then)."""
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0, log_bodies=True)) as sim:
        job = multi_turn_job(tmp_path, sim.base_url, endpoint=endpoint, n=3)
        done = run_cli("run", str(job))
        assert done.returncode == 0, done.stdout + done.stderr
        bodies = sent_bodies(sim.simulator.chat_log())
    assert len(bodies) == 12
    if not sent:
        assert all("session_id" not in b for b in bodies)
        return
    by_row: dict[str, set[str]] = {}
    for b in bodies:
        row = b["messages"][1]["content"].split(":")[0]  # "Row i turn 0"
        by_row.setdefault(row, set()).add(b["session_id"])
    assert len(by_row) == 3 and all(len(ids) == 1 for ids in by_row.values())
    ids = {i for ids in by_row.values() for i in ids}
    assert len(ids) == 3 and all(len(i) <= 256 and "Row" not in i for i in ids)
    # A routing field, not a sampling setting: the answers' settings do not carry it.
    assert all(
        "session_id" not in s for (s,) in query(tmp_path / "out", "SELECT settings FROM results")
    )


def test_no_session_id_goes_to_vllm_or_sglang() -> None:
    gen = GenerationConfig(model="m")
    req = Request(
        item_id="i",
        dataset="d",
        conversation_id="c",
        turn_index=1,
        messages=(Message("user", "hi"),),
    )
    for dialect in ("vllm", "sglang"):
        e = EndpointConfig(base_url="http://127.0.0.1:1/v1", dialect=dialect)
        assert "session_id" not in chat_body(req, gen, e)
    assert chat_body(req, gen, EndpointConfig())["session_id"].startswith("regen-")


def test_a_vllm_servers_cached_tokens_are_recorded_and_priced_at_the_job_files_cache_price(
    tmp_path: Path,
) -> None:
    """vLLM reports its prefix cache's hits (`--enable-prompt-tokens-details`): they are
    recorded, and priced at the job file's cache read price (it sends no cost)."""
    config = SimConfig(
        dialect="vllm",
        served_model="moonshotai/kimi-k2.5",
        seed=6,
        time_scale=0.0,
        report_cached_tokens=True,
        log_bodies=True,
    )
    prices = (
        'dialect = "vllm"\nprompt_usd_per_mtok = 1.0\ncompletion_usd_per_mtok = 4.0\n'
        "cache_read_usd_per_mtok = 0.1"
    )
    with sim_in_thread(config) as sim:
        job = multi_turn_job(tmp_path, sim.base_url, endpoint=prices, n=4)
        done = run_cli("run", str(job))
        assert done.returncode == 0, done.stdout + done.stderr
        log = {e.generation_id: e for e in sim.simulator.chat_log() if e.status == 200}
    rows = query(
        tmp_path / "out",
        "SELECT generation_id, prompt_tokens, completion_tokens, cached_tokens, cost_usd "
        "FROM ledger",
    )
    assert len(rows) == 16 and sum(r[3] for r in rows) > 0
    for gen, prompt, completion, cached, cost in rows:
        assert cached == log[gen].cached_tokens
        expected = (prompt - cached) * 1e-6 + cached * 0.1e-6 + completion * 4e-6
        assert cost == pytest.approx(expected)
