"""Plain aiohttp requests to a simulator, as a client that knows nothing of regen would send."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from regen.sim import RunningSim

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
