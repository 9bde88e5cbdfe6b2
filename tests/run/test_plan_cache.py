"""`regen plan` prices a provider's prompt cache: the share of each dataset's prompts the job's
structure lets a cache serve, at the endpoint's listed cache prices; the cap's verdict on the
cost with the cache, the kill margin and worst cases without any discount."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from regen.engine.budget import Prices
from regen.run.caching import BLOCK_LOSS, FlowCache, expected_share, per_passage
from regen.sim import SimConfig, sim_in_thread
from regen.state.spend import CacheUse
from regen.state.work import PromptShape
from tests.conftest import query, run_cli, write_rows

PROMPT, COMPLETION, READ = 1.0, 2.0, 0.25
"""USD per million tokens, as the job file lists them."""


def conversations() -> list[dict[str, Any]]:
    """Two conversations of 3 and 2 answered turns (each_turn: 5 items)."""
    rows = []
    for i, turns in enumerate((3, 2)):
        msgs = []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"chat {i} turn {t}: " + "word " * 300})
            msgs.append({"role": "assistant", "content": f"answer {t}: " + "reply " * 100})
        rows.append({"messages": msgs})
    return rows


def singles() -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"prompt {i}: " + "x " * 200}]} for i in (1, 2)
    ]


def cache_job(tmp: Path, base_url: str, *, read: float | None, extra: str = "") -> Path:
    """Dataset `turns` (each_turn) and dataset `samples` (3 samples of each prompt), at
    prices the job file lists (a cache read price only when `read` is given)."""
    tmp.mkdir(exist_ok=True)
    write_rows(tmp / "turns.jsonl", conversations())
    write_rows(tmp / "singles.jsonl", singles())
    cache = "" if read is None else f"cache_read_usd_per_mtok = {read}\n"
    job = tmp / "job.toml"
    job.write_text(
        f'[job]\noutput_dir = "out"\n{extra}\n[endpoint]\nbase_url = "{base_url}"\n'
        f'api_key_env = "REGEN_TEST_KEY"\nprompt_usd_per_mtok = {PROMPT}\n'
        f"completion_usd_per_mtok = {COMPLETION}\n{cache}\n"
        '[generation]\nmodel = "moonshotai/kimi-k2.5"\nmax_tokens = 400\n\n'
        '[[datasets]]\nname = "turns"\npath = "turns.jsonl"\nmode = "each_turn"\n\n'
        '[[datasets]]\nname = "samples"\npath = "singles.jsonl"\nsamples = 3\n'
    )
    return job


def plan_json(job: Path) -> dict[str, Any]:
    done = run_cli("plan", str(job), "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def read_by_hand(out: Path, dataset: str) -> int:
    """Estimated prompt tokens a cache serves: every prompt of a conversation but its longest,
    less BLOCK_LOSS each."""
    convs: dict[str, list[int]] = {}
    for conv, est in query(
        out, f"SELECT conversation_id, prompt_tokens_est FROM items WHERE dataset = '{dataset}'"
    ):
        convs.setdefault(conv, []).append(int(est))
    return sum(sum(e) - max(e) - (len(e) - 1) * BLOCK_LOSS for e in convs.values())


def test_the_plan_prices_what_the_structure_lets_the_cache_serve(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=3)) as sim:
        plan = plan_json(cache_job(tmp_path, sim.base_url, read=READ))
    out = tmp_path / "out"
    assert query(out, "SELECT dataset, COUNT(*) FROM items GROUP BY dataset ORDER BY 1") == [
        ("samples", 6),
        ("turns", 5),
    ]
    # No answer yet: every passage is the prior's, so the saving is the read tokens' price gap.
    saved = plan["job"]["caching"]["by_dataset"]
    for name in ("turns", "samples"):
        assert read_by_hand(out, name) > 0
        assert saved[name] == pytest.approx(read_by_hand(out, name) * (PROMPT - READ) / 1e6)
    caching = plan["job"]["caching"]
    assert caching["listed"] is True
    assert caching["without_usd"] - caching["with_usd"] == pytest.approx(sum(saved.values()))
    # The job's expected cost is the one with the cache.
    assert plan["job"]["cost_usd"]["mean"] == pytest.approx(caching["with_usd"])
    (total_est,) = query(out, "SELECT SUM(prompt_tokens_est) FROM items")[0]
    read = read_by_hand(out, "turns") + read_by_hand(out, "samples")
    assert caching["share"] == pytest.approx(read / total_est)


def test_without_a_listed_cache_price_the_plan_expects_no_saving(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=3)) as sim:
        job = cache_job(tmp_path, sim.base_url, read=None)
        plan = plan_json(job)
        shown = run_cli("plan", str(job))
    assert shown.returncode == 0, shown.stderr
    caching = plan["job"]["caching"]
    assert caching["listed"] is False
    assert caching["with_usd"] == caching["without_usd"] == plan["job"]["cost_usd"]["mean"]
    assert set(caching["by_dataset"].values()) == {0.0}
    assert "prompt cache: no saving expected" in " ".join(shown.stdout.split())


def test_the_cap_is_judged_on_the_cost_with_the_cache_the_kill_margin_without(
    tmp_path: Path,
) -> None:
    with sim_in_thread(SimConfig(seed=3)) as sim:
        first = plan_json(cache_job(tmp_path / "a", sim.base_url, read=READ))
        caching, margin = first["job"]["caching"], first["job"]["kill_margin_usd"]
        # A cap that covers the job with the cache, not without it.
        cap = (caching["with_usd"] + caching["without_usd"]) / 2
        capped = f"\n[budget]\nmax_cost_usd = {cap}\n"
        listed = plan_json(cache_job(tmp_path / "b", sim.base_url, read=READ, extra=capped))
        unlisted = plan_json(cache_job(tmp_path / "c", sim.base_url, read=None, extra=capped))
        shown = run_cli("plan", str(tmp_path / "b" / "job.toml"))
    assert listed["job"]["stop"].startswith("every item is expected to finish within")
    assert "stops the job" in unlisted["job"]["stop"]
    # Worst cases take no discount: the margin is the same with a cache price as without.
    assert listed["job"]["kill_margin_usd"] == unlisted["job"]["kill_margin_usd"] == margin
    text = " ".join(shown.stdout.split())
    assert f"it saves ${caching['without_usd'] - caching['with_usd']:.4f}" in text
    assert "cache saves" in text


def test_answers_are_priced_back_without_their_discount_then_with_the_share() -> None:
    prices = Prices(1e-6, 2e-6, cache_read=0.25e-6)
    # Measured: half the prompt tokens read; 1,000 prompt tokens and $0.01 a passage.
    used = CacheUse(prompt_tokens=10_000, cached_tokens=5_000)
    cached, plain = per_passage(0.01, 1000, FlowCache(0.9, used), prices, prior=False)
    paid = 1000 * (0.5 * 1e-6 + 0.5 * 0.25e-6)
    assert plain == pytest.approx(0.01 - paid + 1000 * 1e-6)
    assert cached == pytest.approx(plain - 1000 * 1e-6 + 1000 * (0.9 * 0.25e-6 + 0.1 * 1e-6))
    # Writes billed apart: fresh tokens at the written share measured (a quarter of them here).
    writes = Prices(1e-6, 2e-6, cache_read=0.1e-6, cache_write=1.25e-6)
    used = CacheUse(prompt_tokens=10_000, cached_tokens=6_000, cache_write_tokens=1_000)
    cached, plain = per_passage(0.01, 1000, FlowCache(0.5, used), writes, prior=False)
    paid = 1000 * (0.3 * 1e-6 + 0.6 * 0.1e-6 + 0.1 * 1.25e-6)
    assert plain == pytest.approx(0.01 - paid + 1000 * 1e-6)
    fresh = 1e-6 + 0.25 * 0.25e-6
    assert cached == pytest.approx(plain - 1000 * 1e-6 + 1000 * (0.5 * 0.1e-6 + 0.5 * fresh))
    # No read price listed: the measured cost stands, nothing saved.
    assert per_passage(0.01, 1000, FlowCache(0.9, used), Prices(1e-6, 2e-6), False) == (
        0.01,
        0.01,
    )


def test_what_other_conversations_serve_adds_to_the_part_paid_in_full() -> None:
    shape = PromptShape(items=4, conversations=2, est=4000, longest=2000)
    inner = (4000 - 2000 - 2 * BLOCK_LOSS) / 4000
    assert expected_share(shape, None) == pytest.approx(inner)
    # Conversations' first answers read a fifth of their prompts (a shared system prompt).
    used = CacheUse(
        prompt_tokens=900, cached_tokens=500, first_prompt_tokens=500, first_cached_tokens=100
    )
    assert expected_share(shape, used) == pytest.approx(inner + (1 - inner) * 0.2)


def test_a_rerun_counts_only_the_prompts_left(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=3)) as sim:
        job = cache_job(tmp_path, sim.base_url, read=READ)
        before = plan_json(job)["job"]["caching"]["by_dataset"]["turns"]
        out = tmp_path / "out"
        # The longest turn of the 3-turn conversation answered: its other two are left, the
        # longer of them now paid in full.
        db = sqlite3.connect(out / "state.db")
        with db:
            db.execute(
                "UPDATE items SET status = 'done' WHERE id = (SELECT id FROM items WHERE "
                "dataset = 'turns' ORDER BY prompt_tokens_est DESC LIMIT 1)"
            )
        db.close()
        after = plan_json(job)["job"]["caching"]["by_dataset"]["turns"]
    left: dict[str, list[int]] = {}
    for conv, est in query(
        out,
        "SELECT conversation_id, prompt_tokens_est FROM items "
        "WHERE dataset = 'turns' AND status = 'pending'",
    ):
        left.setdefault(conv, []).append(int(est))
    assert sorted(len(e) for e in left.values()) == [2, 2]
    read = sum(sum(e) - max(e) - (len(e) - 1) * BLOCK_LOSS for e in left.values())
    assert after == pytest.approx(read * (PROMPT - READ) / 1e6)
    assert 0 < after < before
