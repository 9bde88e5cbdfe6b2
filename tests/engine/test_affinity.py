"""Prefix affinity on a pool of self-hosted servers (issue 50): a conversation's turns go to
the server that served its last turn, where its prefix is cached, so a multi-turn job computes
far fewer prefill tokens than when each turn goes to the least loaded server; a server that is
down loses its conversations to the others, and one busy server does not hold them all."""

from __future__ import annotations

import asyncio
import random
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.config import RunConfig
from regen.engine.runtime import EndpointRuntime, LaneRuntime
from regen.engine.scheduler import RunStats
from regen.engine.servers import AFFINITY_SLACK, ServerPool
from regen.sim import SimConfig, sim_in_thread
from regen.sim.prefix_cache import PrefixCache
from regen.sim.server import RunningSim
from tests.conftest import run_cli, write_rows
from tests.engine.test_cache_prices import conversations

MODEL = "qwen/qwen3-8b"
SERVERS = 4


@contextmanager
def vllm_pool(n: int) -> Iterator[list[RunningSim]]:
    """`n` simulated vLLM servers in this process, each with its own prefix cache."""
    config = SimConfig(seed=5, time_scale=0.0, dialect="vllm", served_model=MODEL)
    with ExitStack() as stack:
        yield [stack.enter_context(sim_in_thread(config)) for _ in range(n)]


def prefill(sim: RunningSim) -> int:
    """The prompt tokens a server computed (not read from its prefix cache)."""
    with urllib.request.urlopen(sim.base_url[: -len("/v1")] + "/_sim/stats", timeout=10) as r:
        stats: dict[str, Any] = orjson.loads(r.read())
    return int(stats["prefill_tokens"])


def pool_job(tmp: Path, sims: list[RunningSim], affinity: bool) -> Path:
    endpoints = "".join(
        f'\n[[endpoints]]\nname = "gpu{i}"\nbase_url = "{s.base_url}"\ndialect = "vllm"\n'
        'api_key_env = "REGEN_NO_KEY_NEEDED"\n'
        for i, s in enumerate(sims)
    )
    job = tmp / "job.toml"
    job.write_text(
        f"""
[job]
output_dir = "out"
{endpoints}
[generation]
model = "{MODEL}"
max_tokens = 64

[run]
concurrency = 8
progress_interval_s = 0.5
prefix_affinity = {str(affinity).lower()}

[[datasets]]
name = "chat"
path = "chat.jsonl"
mode = "each_turn"
"""
    )
    return job


def distinct(prompts: list[list[int]], block: int = 16) -> int:
    """Prompt tokens one server with an unbounded cache would compute for these prompts: the
    floor (every distinct prefix block once, and each prompt's last token)."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for ids in prompts:
        cached = 0
        for k in range(block, len(ids) + 1, block):
            if tuple(ids[:k]) in seen:
                cached = k
            seen.add(tuple(ids[:k]))
        total += len(ids) - min(cached, len(ids) - 1)
    return total


def computed(tmp: Path, affinity: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Prefill tokens a 4-server pool computes for 12 conversations of 6 turns each_turn, and
    the floor of the prompts its servers saw."""
    tmp.mkdir()
    write_rows(tmp / "chat.jsonl", conversations(12, 6))
    seen: list[list[int]] = []
    real = PrefixCache.use

    def use(cache: PrefixCache, ids: list[int], now: float, ready: Any = None) -> Any:
        seen.append(list(ids))
        return real(cache, ids, now, ready)

    monkeypatch.setattr(PrefixCache, "use", use)
    with vllm_pool(SERVERS) as sims:
        done = run_cli("run", str(pool_job(tmp, sims, affinity)))
        assert done.returncode == 0, done.stdout + done.stderr
        return sum(prefill(s) for s in sims), distinct(seen)


def test_a_conversations_turns_stay_on_the_server_that_caches_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With affinity each turn after the first reads its history from its server's cache: the
    pool computes near the floor (each server computes the shared system prompt once), and
    with affinity off far more."""
    on, floor = computed(tmp_path / "on", True, monkeypatch)
    off, _ = computed(tmp_path / "off", False, monkeypatch)
    print(f"prefill computed: affinity on {on}, off {off}, floor {floor}")
    assert on <= 1.25 * floor, (on, floor)
    assert off >= 1.5 * on, (on, off)


def endpoint(name: str) -> EndpointRuntime:
    """A self-hosted server as the pool sees it (never sent to: only picked)."""
    return EndpointRuntime(
        name=name,
        sender=None,  # type: ignore[arg-type]
        make_body=lambda *_: {},
        health_url=f"http://{name}/health",
    )


def pool(affinity: bool = True) -> tuple[ServerPool, LaneRuntime]:
    eps = [endpoint(f"gpu{i}") for i in range(3)]
    lane = LaneRuntime.__new__(LaneRuntime)
    lane.name, lane.endpoints = "main", eps
    servers = ServerPool(
        RunStats.__new__(RunStats),
        RunConfig(prefix_affinity=affinity),
        random.Random(1),
        sleep=asyncio.sleep,
        stopping=asyncio.Event(),
        stop=lambda *_, **__: None,
    )
    return servers, lane


def test_a_down_server_loses_its_conversations_and_a_busy_one_sheds_them() -> None:
    """A conversation stays on its server while that one is healthy and within the bound;
    drained, its next turn goes to the least loaded other server and stays there; a server
    far more loaded than the least loaded one gives its conversations away."""
    servers, lane = pool()
    first = servers.pick(lane, "c1")
    first.outstanding += 1
    assert all(servers.pick(lane, "c1") is first for _ in range(5))
    first.health.drain()
    moved = servers.pick(lane, "c1")
    assert moved is not first
    first.health.revive()
    assert servers.pick(lane, "c1") is moved  # it stays where its prefix now is
    factor, extra = AFFINITY_SLACK
    moved.outstanding = int(factor * 1 + extra)  # the others have at most 1
    assert servers.pick(lane, "c1") is not moved


def test_a_conversations_own_attempts_do_not_count_against_its_server() -> None:
    """The turns a leader's answer lets go go out together: as many of them in flight on the
    conversation's server as would shed another conversation keep it there."""
    servers, lane = pool()
    home = servers.pick(lane, "c1")
    factor, extra = AFFINITY_SLACK
    for _ in range(int(factor * 1 + extra)):  # the others have at most 1
        home.took("c1")
    assert servers.pick(lane, "c1") is home
    home.took("c2")  # one attempt of another conversation is load like any other
    for _ in range(int(factor * 1 + extra)):
        home.gave_back("c1")
        home.took("c2")
    assert servers.pick(lane, "c1") is not home
    assert home.own == {"c2": int(factor * 1 + extra) + 1}


def test_without_affinity_or_a_conversation_the_least_loaded_server_takes_it() -> None:
    servers, lane = pool(affinity=False)
    a = servers.pick(lane, "c1")
    a.outstanding += 1
    assert servers.pick(lane, "c1") is not a
