"""The gate (issue 46): every number a provider sends that moves money is an amount and
plausible against what was asked, or it is not believed: charged at its worst case, said once
per field. Whole runs against a lying provider are in test_lying_provider.py; these are the
rules one at a time."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regen.config import load_job
from regen.conversation import Usage
from regen.engine.billing import Account, Baseline, reconcile_accounts
from regen.engine.budget import REPRICED_META, repriced_meta
from regen.engine.client.account import generation_charge, key_info, model_listing
from regen.engine.client.keys import _record
from regen.engine.client.response import choice_bodies, parse_chat_body, parse_choices
from regen.engine.gate import (
    BILL_CEILING,
    WORST,
    Asked,
    Gate,
    amount,
    doubts,
    listed_price,
    listing,
)
from regen.run.accounts import key_limit
from regen.state.db import Store

HOSTILE: list[Any] = [-5, -1, 1e18, math.nan, math.inf, -math.inf, "-1", "NaN", "free", True, [1]]


class Canned:
    """A JsonGetter that answers one body for any path."""

    def __init__(self, body: Any) -> None:
        self.body = body

    async def get_json(self, path: str) -> Any:
        return self.body


def test_an_amount_is_a_finite_number_of_zero_or_more() -> None:
    assert [amount(v) for v in (0, 3, 2.5, 10**30)] == [0.0, 3.0, 2.5, 1e30]
    assert all(amount(v) is None for v in HOSTILE if v != 1e18)
    assert amount(10**400) is None  # past a float's range
    assert listed_price("0.0000025") == 2.5e-6 and listed_price(" 1e-6 ") == 1e-6
    assert all(listed_price(v) is None for v in ("-1", "0x1", "NaN", "Infinity", -1, 1.0, 1e18))


def test_a_catalogue_price_of_zero_or_below_is_no_basis_for_a_worst_case() -> None:
    # "-1" on every endpoint switched the cap off; "0" let $1.27 be billed on $0.50.
    for price in ("-1", "0", "NaN", None, "free"):
        found = listing("m/x", [("a", price, price), ("b", price, price)])
        assert found.high is None and [who for who, _ in found.refused] == ["a", "b"]
    # One endpoint that hides its price does not lower the worst case: the others' stand.
    found = listing("m/x", [("cheap", "1e-7", "2e-7"), ("dear", "0", "0"), ("mid", "5e-7", "1e-6")])
    assert found.high == (5e-7, 1e-6) and found.low_completion == 2e-7
    assert found.refused == (("dear", "pricing.completion = '0' for a paid model"),)
    # A free model's price of 0 is its price.
    free = listing("m/x:free", [("a", "0", "0")])
    assert free.high == (0.0, 0.0) and not free.refused


async def _listed(body: Any) -> Any:
    return await model_listing(Canned(body), "m/x")


def test_the_catalogue_is_read_through_the_gate() -> None:
    endpoints = [
        {"tag": "a/fp8", "pricing": {"prompt": "-1", "completion": "-1"}},
        {"provider_name": "B", "pricing": {"prompt": "0.000001", "completion": "0.000004"}},
        {"pricing": "free"},
    ]
    found = asyncio.run(_listed({"data": {"endpoints": endpoints}}))
    assert found.high == (1e-6, 4e-6)
    assert [who for who, _ in found.refused] == ["a/fp8", "endpoint 3"]
    assert asyncio.run(_listed({"data": {"endpoints": "none"}})) is None


def test_usage_beyond_what_was_asked_is_not_believed() -> None:
    asked = Asked(max_tokens=100, prompt_bound=500, worst_usd=0.001, floor_usd_per_token=1e-6)
    most = math.ceil(100 * 1.05) + 16
    assert asked.most_completion == most
    fine = Usage(900, most, 0, 0.0005)
    assert doubts(fine, asked, "usage") == []
    assert doubts(Usage(900, most + 1, 0, 0.0005), asked, "usage")[0].startswith(
        "usage.completion_tokens = 122 (max_tokens 100"
    )
    assert asked.most_prompt == 2 * 500 + 4096
    assert "prompt_tokens" in doubts(Usage(5097, 10, 0, 0.0005), asked, "usage")[0]
    assert "above 16x" in doubts(Usage(10, 10, 0, 0.001 * BILL_CEILING * 1.01), asked, "usage")[0]
    # A bill of 0 (or a fraction of a cent) for tokens written is no bill for them.
    assert "below 0.1x" in doubts(Usage(10, 100, 0, 0.0), asked, "usage")[0]
    assert doubts(Usage(10, 100, 0, 100 * 1e-6 * 0.1), asked, "usage") == []
    # Nothing written, nothing billed: believed (OpenRouter's "not billed").
    assert doubts(Usage(0, 0, 0, 0.0), asked, "record") == []
    assert doubts(Usage(junk=("cost = nan",)), asked, "usage") == ["usage.cost = nan"]


def test_the_gate_charges_the_worst_case_and_says_each_field_once() -> None:
    gate = Gate()
    asked = Asked(max_tokens=100, prompt_bound=500, worst_usd=0.002)
    for who in ("DeepInfra", "DeepInfra", "Fireworks"):
        charged = gate.usage(
            Usage(10, 10, 0, -5.0, junk=("cost = -5",)), asked, channel="an answer", who=who
        )
        assert charged == Usage(500, 100, 0, 0.002, source=WORST)
    lines = gate.take_lines()
    assert len(lines) == 1 and "DeepInfra sent usage.cost = -5 in an answer" in lines[0]
    assert gate.take_lines() == []
    end = gate.end_lines()
    assert end[0] == "gate: an answer usage.cost not believed 3 time(s) (DeepInfra 2, Fireworks 1)"
    assert "$0.0060 charged at worst cases" in end[1]
    believed = Usage(10, 10, 0, 0.00001)
    assert gate.usage(believed, asked, channel="an answer", who="x") is believed


def test_a_line_the_gate_writes_holds_no_control_characters_or_key() -> None:
    gate = Gate()
    gate.refuse("/key", "evil\x1b[2J\nname", "usage = 'x'", "taken as unknown")
    (line,) = gate.take_lines()
    assert "\x1b" not in line and "\n" not in line


def test_an_answer_whose_usage_holds_a_bare_nan_is_kept_and_flagged() -> None:
    """Python's json writes NaN bare; orjson refuses it, and the whole answer was lost."""
    body = {
        "id": "gen-1",
        "provider": "P",
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": float("nan"), "cost": float("inf")},
    }
    raw = json.dumps(body).encode()
    assert b"NaN" in raw and b"Infinity" in raw
    result = parse_chat_body("item", raw, status=200, latency_s=0.1)
    assert result.message.content == "hi"
    assert result.usage.junk == ("completion_tokens = nan", "cost = inf")
    assert result.usage.cost_usd is None and result.usage.completion_tokens == 0


def test_each_share_of_a_junk_bill_is_junk() -> None:
    choice = {"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
    body = {
        "choices": [{**choice, "index": 0}, {**choice, "index": 1}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "cost": -1},
    }
    shares = choice_bodies(body, 2)
    assert [s["usage"]["cost"] for s in shares] == [-1, -1]
    results = parse_choices(["a", "b"], json.dumps(body).encode(), latency_s=0.0)
    assert all(r.usage.junk == ("cost = -1",) for r in results)  # type: ignore[union-attr]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_generation_record_that_is_no_amount_is_junk(value: Any) -> None:
    record = {"total_cost": value, "tokens_prompt": 5, "tokens_completion": 7}
    found = asyncio.run(generation_charge(Canned({"data": record}), "gen-1"))
    assert found is not None
    usage, _ = found
    assert usage.junk and usage.junk[0].startswith("total_cost = ")  # 1e18: past any count
    assert doubts(usage, Asked(max_tokens=50, worst_usd=0.01), "record")[0].startswith(
        "record.total_cost = "
    )


def test_an_error_generation_billed_nothing_is_believed() -> None:
    """Zero-completion insurance: an error finish is not billed, whatever tokens it counted."""
    record = {"total_cost": 0, "tokens_completion": 40, "finish_reason": "error"}
    usage, _ = asyncio.run(generation_charge(Canned({"data": record}), "g"))  # type: ignore[misc]
    assert usage == Usage()
    stopped = {**record, "finish_reason": "stop"}
    usage, _ = asyncio.run(generation_charge(Canned({"data": stopped}), "g"))  # type: ignore[misc]
    assert doubts(usage, Asked(max_tokens=50, floor_usd_per_token=1e-6), "record")


@pytest.mark.parametrize("value", [v for v in HOSTILE if v != 1e18])
def test_an_accounts_usage_that_is_no_amount_is_unknown(value: Any) -> None:
    gate = Gate()
    info = asyncio.run(key_info(Canned({"data": {"usage": value, "limit_remaining": 2}}), gate))
    assert info is None
    assert "usage = " in gate.take_lines()[0]
    assert _record({"hash": "h", "usage": value}).usage_usd is None


def test_earlier_keys_usage_past_any_cap_does_not_block_the_job(tmp_path: Path) -> None:
    """A deleted key's usage read as 1e18 would have left every later key a limit of 0."""
    job_file = tmp_path / "job.toml"
    (tmp_path / "a.jsonl").write_text("")
    job_file.write_text(
        '[job]\nname = "j"\noutput_dir = "out"\n[endpoint]\nbase_url = "http://127.0.0.1:1/v1"\n'
        '[generation]\nmodel = "m"\n[budget]\nmax_cost_usd = 2.0\n'
        '[[datasets]]\nname = "a"\npath = "a.jsonl"\n'
    )
    job = load_job(job_file)
    store = Store.open(tmp_path / "out")
    try:
        gate = Gate()
        assert key_limit(job, [], store, 1e18, gate) == 2.0
        assert "usage = 1e+18" in gate.take_lines()[0]
        assert key_limit(job, [], store, 0.5, gate) == 1.5
    finally:
        store.close()


def test_a_learned_price_factor_is_bounded_by_the_ceiling(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "out")
    try:
        entries = {
            "a": {"prompt": 1e-6, "completion": 2e-6, "factor": 1.16e14},
            "b": {"prompt": 1e-6, "completion": 2e-6, "factor": 2.0},
        }
        store.set_meta(REPRICED_META, json.dumps(entries))
        assert list(repriced_meta(store)) == ["b"]
    finally:
        store.close()


@given(
    fields=st.dictionaries(
        st.sampled_from(["prompt_tokens", "completion_tokens", "cost"]),
        st.one_of(
            st.sampled_from(HOSTILE),
            st.integers(-(10**20), 10**20),
            st.floats(allow_nan=True, allow_infinity=True),
        ),
    ),
    max_tokens=st.integers(1, 4096),
)
def test_whatever_an_answer_says_its_charge_is_within_the_worst_case(
    fields: dict[str, Any], max_tokens: int
) -> None:
    choice = {"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
    raw = json.dumps({"choices": [choice], "usage": fields}).encode()
    usage = parse_chat_body("i", raw, status=200, latency_s=0.0).usage
    worst = 0.01
    asked = Asked(max_tokens=max_tokens, prompt_bound=300, worst_usd=worst)
    charged = Gate().usage(usage, asked, channel="an answer", who="p")
    assert charged.completion_tokens <= asked.most_completion
    assert charged.prompt_tokens <= asked.most_prompt
    cost = charged.cost_usd
    assert cost is None or (math.isfinite(cost) and 0 <= cost <= worst * BILL_CEILING)


def test_an_account_usage_below_its_baseline_is_no_usage(tmp_path: Path) -> None:
    """A /key usage that fell (0 after $5) would have counted held requests at nothing."""
    store = Store.open(tmp_path / "out")
    try:
        account = Account("http://127.0.0.1:1/api/v1", "KEY", ("e",))
        baselines = {account.key: Baseline(5.0, 0.0)}

        async def reads(value: float) -> list[Any]:
            async def read() -> float | None:
                return value

            gate = Gate()
            found = await reconcile_accounts(store, [account], baselines, {account.key: read}, gate)
            return [found, gate.take_lines()]

        fell, said = asyncio.run(reads(0.0))
        assert fell == [] and "usage = 0 (below $5" in said[0]
        grew, said = asyncio.run(reads(5.5))
        assert [r.provider_usd for r in grew] == [0.5] and said == []
    finally:
        store.close()
