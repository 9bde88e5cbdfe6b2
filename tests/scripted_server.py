"""A real aiohttp server on 127.0.0.1 whose answers a test scripts, request by request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

OK_BODY = {
    "id": "gen-1-x",
    "provider": "Scripted",
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "fine"}}
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 0.001},
}


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=lambda: OK_BODY)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Scripted:
    """Answers with `script(n, body)` for the n-th request (0-based)."""

    script: Callable[[int, dict[str, Any]], Reply]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        n = len(self.requests)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = self.script(n, body)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            text = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            return web.Response(
                status=reply.status,
                text=text,
                headers=reply.headers,
                content_type="application/json",
            )
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def scripted_server(
    script: Callable[[int, dict[str, Any]], Reply],
) -> AsyncIterator[Scripted]:
    state = Scripted(script)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", state.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield state
    finally:
        await runner.cleanup()
