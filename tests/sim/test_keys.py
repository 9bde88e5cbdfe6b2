"""Usage per key, OpenRouter's key management API (/keys), and how a key's limit is enforced."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from datetime import datetime
from typing import Any

import pytest

from regen.sim import RunningSim, SimConfig, SimEndpoint, SimModel, sim_in_thread
from tests.sim.helpers import body, call, get, post

MGMT = "sk-or-v1-management-0123456789"
KEY_FIELDS = {
    "hash",
    "name",
    "label",
    "disabled",
    "limit",
    "limit_remaining",
    "limit_reset",
    "include_byok_in_limit",
    "usage",
    "usage_daily",
    "usage_weekly",
    "usage_monthly",
    "byok_usage",
    "byok_usage_daily",
    "byok_usage_weekly",
    "byok_usage_monthly",
    "created_at",
    "updated_at",
    "creator_user_id",
    "workspace_id",
    "expires_at",
}


def _config(**kw: Any) -> SimConfig:
    """One endpoint at known prices, so that what a key can afford is exact."""
    ep = SimEndpoint(
        provider_name="Solo",
        tag="solo",
        ttft_s=0.0,
        tokens_per_s=1e6,
        prompt_price=1e-4,
        completion_price=2e-6,
    )
    kw.setdefault("time_scale", 0)
    kw.setdefault("generation_delay_s", 0)
    return SimConfig(management_keys=[MGMT], models=[SimModel(id="x/y", endpoints=[ep])], **kw)


def solo(text: str = "hello", **kw: Any) -> dict[str, Any]:
    return {**body(text, **kw), "model": "x/y"}


async def create(sim: RunningSim, **fields: Any) -> tuple[str, dict[str, Any]]:
    """A new key's secret and key object."""
    status, data = await call(sim, "POST", "/keys", MGMT, {"name": "k", **fields})
    assert status == 201, data
    return data["key"], data["data"]


async def test_only_management_keys_manage_keys() -> None:
    with sim_in_thread(_config()) as sim:
        secret, _ = await create(sim)
        for method, path in (
            ("GET", "/keys"),
            ("POST", "/keys"),
            ("GET", "/keys/abc"),
            ("PATCH", "/keys/abc"),
            ("DELETE", "/keys/abc"),
        ):
            for key in ("sk-plain", secret):
                status, data = await call(sim, method, path, key, {"name": "x"})
                assert (status, data["error"]) == (
                    403,
                    {"code": 403, "message": "Only management keys can perform this operation"},
                )
            status, data = await call(sim, method, path, None, {"name": "x"})
            assert (status, data["error"]["message"]) == (401, "No auth credentials found")


async def test_create_list_get_patch_delete() -> None:
    with sim_in_thread(_config()) as sim:
        secret, key = await create(
            sim, name="batch", limit=5, limit_reset="monthly", expires_at="2099-12-31T23:59:59Z"
        )
        assert re.fullmatch(r"sk-or-v1-[0-9a-f]{64}", secret)
        assert set(key) == KEY_FIELDS
        assert key["hash"] == hashlib.sha256(secret.encode()).hexdigest()
        assert key["label"].startswith("sk-or-v1-") and "..." in key["label"]
        assert secret[12:-4] not in key["label"]
        assert (key["name"], key["limit"], key["limit_remaining"], key["limit_reset"]) == (
            "batch",
            5.0,
            5.0,
            "monthly",
        )
        assert (key["usage"], key["disabled"], key["updated_at"]) == (0, False, None)
        assert key["expires_at"] == "2099-12-31T23:59:59Z"
        assert datetime.fromisoformat(key["created_at"]).utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        second, other = await create(sim, name="second")
        assert other["limit"] is None and other["limit_remaining"] is None

        status, data = await call(sim, "GET", "/keys", MGMT)
        assert status == 200 and [k["name"] for k in data["data"]] == ["second", "batch"]
        assert all("key" not in k and secret not in str(k) for k in data["data"])
        status, data = await call(sim, "GET", f"/keys/{key['hash']}", MGMT)
        assert status == 200 and data["data"]["name"] == "batch"

        status, data = await call(
            sim, "PATCH", f"/keys/{key['hash']}", MGMT, {"disabled": True, "limit": None}
        )
        assert status == 200
        assert (data["data"]["disabled"], data["data"]["limit"]) == (True, None)
        assert data["data"]["updated_at"] is not None
        assert data["data"]["limit_reset"] == "monthly"  # what the patch left out stays
        status, data = await call(sim, "GET", "/keys", MGMT)
        assert [k["name"] for k in data["data"]] == ["second"]
        status, data = await call(sim, "GET", "/keys?include_disabled=true&offset=1", MGMT)
        assert [k["name"] for k in data["data"]] == ["batch"]

        status, data = await call(sim, "DELETE", f"/keys/{key['hash']}", MGMT)
        assert (status, data) == (200, {"deleted": True})
        for method in ("GET", "PATCH", "DELETE"):
            status, data = await call(sim, method, f"/keys/{key['hash']}", MGMT, {})
            assert status == 404 and data["error"]["code"] == 404
        status, data = await call(sim, "GET", "/keys?include_disabled=true", MGMT)
        assert [k["name"] for k in data["data"]] == ["second"]
        assert sim.simulator.keys.of_secret(second) is not None


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "name",
        {},
        {"name": ""},
        {"name": 3},
        {"name": "k", "limit": -1},
        {"name": "k", "limit": "5"},
        {"name": "k", "limit": True},
        {"name": "k", "limit_reset": "hourly"},
        {"name": "k", "include_byok_in_limit": "yes"},
        {"name": "k", "expires_at": "tomorrow"},
        {"name": "k", "expires_at": "2099-12-31T23:59:59+02:00"},
    ],
)
async def test_bad_bodies_are_400(bad: Any) -> None:
    with sim_in_thread(_config()) as sim:
        status, data = await call(sim, "POST", "/keys", MGMT, bad)
        assert status == 400 and data["error"]["code"] == 400 and data["error"]["message"]
        _, made = await call(sim, "POST", "/keys", MGMT, {"name": "ok"})
        for patch in ({"disabled": "no"}, {"limit": -2}, {"name": ""}, [1]):
            status, data = await call(sim, "PATCH", f"/keys/{made['data']['hash']}", MGMT, patch)
            assert status == 400 and data["error"]["code"] == 400
        status, _ = await call(sim, "GET", "/keys?include_disabled=maybe", MGMT)
        assert status == 400
        assert sim.simulator.keys.created == 1


async def test_secrets_follow_the_seed_not_the_clock() -> None:
    async def secrets(seed: int) -> list[str]:
        with sim_in_thread(_config(seed=seed)) as sim:
            return [(await create(sim))[0] for _ in range(3)]

    first = await secrets(7)
    assert first == await secrets(7) and len(set(first)) == 3
    assert set(first).isdisjoint(await secrets(8))


async def test_a_created_key_is_a_normal_key_with_its_own_usage() -> None:
    # Static keys restricted: a created key is accepted all the same.
    with sim_in_thread(_config(api_keys=["sk-static-1", "sk-static-2"])) as sim:
        secret, _ = await create(sim, limit=10, limit_reset="daily")
        status, mine, hdrs = await post(sim, solo("from the created key"), key=secret)
        assert status == 200
        status, static, _ = await post(sim, solo("from a static key"), key="sk-static-1")
        assert status == 200
        s = sim.simulator
        cost_mine, cost_static = mine["usage"]["cost"], static["usage"]["cost"]
        assert s.account.usage_of(secret) == pytest.approx(cost_mine)
        assert s.account.usage_of("sk-static-1") == pytest.approx(cost_static)
        assert s.account.usage_of("sk-static-2") == 0
        assert s.billed_usd() == pytest.approx(cost_mine + cost_static)
        assert s.billed_by_key() == {
            secret: pytest.approx(cost_mine),
            "sk-static-1": pytest.approx(cost_static),
        }
        # Every chat request logs the key it was made with, and what it was billed.
        log = s.chat_log()
        assert [(e.key, e.authorization) for e in log] == [
            (secret, f"Bearer {secret}"),
            ("sk-static-1", "Bearer sk-static-1"),
        ]
        by_key: dict[str, float] = {}
        for e in log:
            if e.billed and e.key is not None:
                by_key[e.key] = by_key.get(e.key, 0.0) + e.cost_usd
        assert by_key == s.billed_by_key()

        status, data = await get(sim, "/key", key=secret)
        d = data["data"]
        assert status == 200 and d["is_management_key"] is False
        assert (d["limit"], d["limit_reset"]) == (10.0, "daily")
        assert d["usage"] == d["usage_daily"] == pytest.approx(cost_mine)
        assert d["limit_remaining"] == pytest.approx(10 - cost_mine)
        status, data = await get(sim, "/key", key="sk-static-2")
        assert data["data"]["usage"] == 0 and data["data"]["limit"] is None
        # Any key of the account reads any of its generations (a rerun looks up an old key's).
        for key in (secret, "sk-static-2", MGMT):
            status, gen = await get(sim, f"/generation?id={static['id']}", key=key)
            assert status == 200 and gen["data"]["total_cost"] == pytest.approx(cost_static)
        assert hdrs["X-Generation-Id"] == mine["id"]
        assert (await get(sim, "/models", key=secret))[0] == 200
        assert (await post(sim, solo(), key="sk-unknown"))[0] == 401


async def test_management_keys_make_no_completions_but_read_credits() -> None:
    with sim_in_thread(_config(credits_usd=3.0)) as sim:
        status, data, _ = await post(sim, solo(), key=MGMT)
        assert status == 401 and data["error"]["code"] == 401
        assert data["error"]["message"].startswith("Management keys cannot be used for completions")
        assert "key" in data["error"]["message"]
        secret, _ = await create(sim)
        _, answer, _ = await post(sim, solo(), key=secret)
        status, data = await get(sim, "/credits", key=MGMT)
        assert status == 200
        assert data["data"] == {"total_credits": 3.0, "total_usage": answer["usage"]["cost"]}
        status, data = await get(sim, "/key", key=MGMT)
        assert data["data"]["is_management_key"] is True and data["data"]["usage"] == 0


async def test_a_disabled_key_is_refused_until_enabled_again() -> None:
    with sim_in_thread(_config()) as sim:
        secret, key = await create(sim)
        await call(sim, "PATCH", f"/keys/{key['hash']}", MGMT, {"disabled": True})
        status, data, _ = await post(sim, solo(), key=secret)
        assert (status, data["error"]["message"]) == (401, "This API key is disabled")
        assert (await get(sim, "/key", key=secret))[0] == 401
        await call(sim, "PATCH", f"/keys/{key['hash']}", MGMT, {"disabled": False})
        assert (await post(sim, solo(), key=secret))[0] == 200


async def test_an_expired_key_is_refused() -> None:
    with sim_in_thread(_config()) as sim:
        secret, _ = await create(sim, expires_at="2001-01-01T00:00:00Z")
        status, data, _ = await post(sim, solo(), key=secret)
        assert (status, data["error"]["message"]) == (401, "This API key has expired")


async def test_a_deleted_key_is_refused_but_its_answers_in_flight_are_billed() -> None:
    with sim_in_thread(_config()) as sim:
        s = sim.simulator
        secret, key = await create(sim)
        s.hold()
        pending = asyncio.create_task(post(sim, solo("in flight"), key=secret))
        assert await asyncio.to_thread(s.wait_until, lambda: s.held == 1)
        status, _ = await call(sim, "DELETE", f"/keys/{key['hash']}", MGMT)
        assert status == 200
        s.release()
        status, answer, _ = await pending
        assert status == 200  # it was accepted before the key went
        assert await asyncio.to_thread(s.wait_billed)
        assert s.account.usage_of(secret) == pytest.approx(answer["usage"]["cost"])
        assert s.billed_usd() == pytest.approx(answer["usage"]["cost"])
        for path in ("/key", f"/generation?id={answer['id']}"):
            status, data = await get(sim, path, key=secret)
            assert (status, data["error"]["message"]) == (401, "User not found.")
        status, data, _ = await post(sim, solo(), key=secret)
        assert (status, data["error"]["message"]) == (401, "User not found.")


async def test_a_key_limit_refuses_what_it_cannot_pay_for_when_the_request_starts() -> None:
    with sim_in_thread(_config(credits_usd=100.0)) as sim:
        secret, _ = await create(sim, limit=0.02)
        status, data, _ = await post(sim, solo("big", max_tokens=10_000), key=secret)
        prompt = sim.simulator.chat_log()[-1].prompt_tokens
        can = int((0.02 - prompt * 1e-4) / 2e-6)
        assert status == 402 and data["error"]["code"] == 402
        assert data["error"]["message"] == (
            "This request requires more credits, or fewer max_tokens. You requested up to "
            f"10000 tokens, but can only afford {can}. To increase, visit "
            "https://openrouter.ai/settings/keys and create a key with a higher limit"
        )
        assert (await post(sim, solo("big", max_tokens=can), key=secret))[0] == 200
        # Another key of the account is not bound by it.
        assert (await post(sim, solo("big", max_tokens=10_000), key="sk-other"))[0] == 200


async def test_requests_in_flight_when_the_limit_is_reached_finish_and_are_billed() -> None:
    """OpenRouter checks a key's limit when a request starts, against what the key was billed;
    answers still generating are billed when they end. So the key's usage ends above its
    limit by what was in flight, and the next request is refused."""
    with sim_in_thread(_config()) as sim:
        s = sim.simulator
        secret, key = await create(sim, limit=1.0)
        s.hold()
        pending = [
            asyncio.create_task(post(sim, solo(f"q{i}", max_tokens=500), key=secret))
            for i in range(3)
        ]
        assert await asyncio.to_thread(s.wait_until, lambda: s.held == 3)
        assert s.account.usage_of(secret) == 0  # nothing billed yet
        limit = 1e-4  # below what the prompt of any one of them costs
        status, _ = await call(sim, "PATCH", f"/keys/{key['hash']}", MGMT, {"limit": limit})
        assert status == 200
        # A new request is refused at once: the limit is checked when a request starts.
        status, data, _ = await post(sim, solo("late", max_tokens=500), key=secret)
        assert status == 402 and "can only afford 0" in data["error"]["message"]
        s.release()
        answers = await asyncio.gather(*pending)
        assert [status for status, _, _ in answers] == [200, 200, 200]
        assert await asyncio.to_thread(s.wait_billed)
        spent = sum(a["usage"]["cost"] for _, a, _ in answers)
        assert s.account.usage_of(secret) == pytest.approx(spent) and spent > limit
        status, data = await get(sim, "/key", key=secret)
        assert data["data"]["limit_remaining"] == pytest.approx(limit - spent)
        assert data["data"]["limit_remaining"] < 0
        status, data, _ = await post(sim, solo("after", max_tokens=1), key=secret)
        assert status == 402 and "settings/keys" in data["error"]["message"]


async def test_per_key_usage_is_charged_when_the_answer_ends_even_if_the_client_went() -> None:
    # A 5-second generation at time_scale 0.1 (half a second): the client goes at once.
    ep = SimEndpoint(provider_name="Slow", tag="slow", ttft_s=5.0, completion_price=1e-6)
    cfg = SimConfig(time_scale=0.1, models=[SimModel(id="x/y", endpoints=[ep])])
    with sim_in_thread(cfg) as sim:
        s = sim.simulator
        task = asyncio.create_task(post(sim, solo(), key="sk-gone"))
        deadline = time.monotonic() + 10
        while s.unbilled == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert s.unbilled == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(s.wait_billed)
        assert s.billed_usd() > 0
        assert s.account.usage_of("sk-gone") == pytest.approx(s.billed_usd())
