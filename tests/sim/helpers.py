"""Plain aiohttp requests to a simulator, as a client that knows nothing of regen would send."""

from __future__ import annotations

import json
import random
from typing import Any

import aiohttp

from regen.sim import RunningSim
from regen.sim.words import WORDS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


def body(text: str = "hello", **kw: Any) -> dict[str, Any]:
    return {
        "model": "moonshotai/kimi-k2.5",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": text}],
        **kw,
    }


def text(seed: int, n: int = 120) -> str:
    """n sim words drawn with a seed (one token each)."""
    return " ".join(random.Random(seed).choices(WORDS, k=n))


def turns(conv: int, k: int) -> list[dict[str, Any]]:
    """The first k user turns of conversation `conv` (with answers between them), long enough
    to fill several cache blocks; each turn's prompt extends the one before."""
    out: list[dict[str, Any]] = [{"role": "system", "content": text(10_000 + conv)}]
    for t in range(k):
        if t:
            out.append({"role": "assistant", "content": text(20_000 + conv * 100 + t, 40)})
        out.append({"role": "user", "content": text(30_000 + conv * 100 + t, 60)})
    return out


def headers(key: str | None = "k", fault: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {key}"} if key else {}
    if fault:
        h["X-Sim-Fault"] = fault
    return h


async def post(
    sim: RunningSim, data: dict[str, Any], key: str | None = "k", fault: str | None = None
) -> tuple[int, Any, dict[str, str]]:
    """Status, parsed JSON body and headers of a non-streaming request."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.base_url}/chat/completions", json=data, headers=headers(key, fault)) as r,
    ):
        raw = await r.read()
        return r.status, json.loads(raw), dict(r.headers)


async def post_raw(sim: RunningSim, data: dict[str, Any], fault: str | None = None) -> bytes:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.base_url}/chat/completions", json=data, headers=headers(fault=fault)) as r,
    ):
        return await r.read()


async def stream(
    sim: RunningSim, data: dict[str, Any], fault: str | None = None
) -> tuple[int, list[str]]:
    """Status and the raw SSE lines (blank lines dropped) of a streaming request."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{sim.base_url}/chat/completions",
            json={**data, "stream": True},
            headers=headers(fault=fault),
        ) as r,
    ):
        text = (await r.read()).decode()
        return r.status, [line for line in text.split("\n") if line]


async def get(sim: RunningSim, path: str, key: str | None = "k") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{sim.base_url}{path}", headers=headers(key)) as r,
    ):
        return r.status, await r.json()


async def call(
    sim: RunningSim, method: str, path: str, key: str | None, data: Any = None
) -> tuple[int, Any]:
    """Status and parsed JSON body of any request (`data` sent as its JSON body)."""
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{sim.base_url}{path}", json=data, headers=headers(key)) as r,
    ):
        return r.status, await r.json()


def chunks(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE stream (comments and [DONE] skipped)."""
    return [
        json.loads(line[6:])
        for line in lines
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
