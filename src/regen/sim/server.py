"""The simulated OpenRouter-compatible server (aiohttp.web), for the demo, tests and benchmarks.

Never imported by the runtime path: only the CLI (`regen sim`, `regen demo`), tests and
benchmarks use it.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from regen.sim.config import SimConfig, SimEndpoint
from regen.sim.generate import count_prompt_tokens, generate, request_rng

_ALNUM = string.ascii_letters + string.digits


def _error(status: int, message: str, **extra: Any) -> web.Response:
    body = {"error": {"code": status, "message": message, **extra}}
    return web.json_response(body, status=status)


@dataclass
class LoggedRequest:
    """What the simulator saw and answered, for tests and benchmarks to check."""

    at: float
    path: str
    status: int
    authorization: str | None
    model: str | None = None
    provider: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    body: dict[str, Any] = field(default_factory=dict)


class Simulator:
    """State shared by the handlers: the config, and a log of every request."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.log: list[LoggedRequest] = []
        self._lock = threading.Lock()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/api/v1", "/v1"):
            app.router.add_post(f"{prefix}/chat/completions", self.chat_completions)
            app.router.add_get(f"{prefix}/models", self.models)
        return app

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.log.append(entry)

    def billed_usd(self) -> float:
        with self._lock:
            return sum(e.cost_usd for e in self.log)

    def _check_auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization")
        if not header or not header.startswith("Bearer ") or not header[7:].strip():
            return _error(401, "No auth credentials found")
        if self.config.api_keys and header[7:] not in self.config.api_keys:
            return _error(401, "User not found.")
        return None

    async def models(self, request: web.Request) -> web.Response:
        data = []
        for m in self.config.models:
            cheapest = min(m.endpoints, key=lambda e: e.completion_price)
            data.append(
                {
                    "id": m.id,
                    "canonical_slug": m.id,
                    "name": m.id,
                    "context_length": m.context_length,
                    "pricing": {
                        "prompt": f"{cheapest.prompt_price:.10f}".rstrip("0").rstrip(".") or "0",
                        "completion": f"{cheapest.completion_price:.10f}".rstrip("0").rstrip(".")
                        or "0",
                        "request": "0",
                        "image": "0",
                    },
                    "top_provider": {
                        "context_length": m.context_length,
                        "max_completion_tokens": max(e.max_completion_tokens for e in m.endpoints),
                        "is_moderated": False,
                    },
                    "supported_parameters": [
                        "max_tokens",
                        "temperature",
                        "top_p",
                        "seed",
                        "tools",
                        "tool_choice",
                        "reasoning",
                    ],
                }
            )
        return web.json_response({"data": data})

    async def chat_completions(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        denied = self._check_auth(request)
        if denied is not None:
            self._record(LoggedRequest(time.time(), request.path, denied.status, auth))
            return denied
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._reject(request, 400, "Invalid JSON body")
        if not isinstance(body, dict):
            return self._reject(request, 400, "Body must be a JSON object")
        model = self.config.model(str(body.get("model")))
        if model is None:
            return self._reject(request, 400, f"{body.get('model')} is not a valid model ID")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._reject(request, 400, "messages must be a non-empty list")
        if body.get("stream"):
            return self._reject(request, 400, "stream is not supported by this simulator yet")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 4096
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return self._reject(request, 400, "max_tokens must be a positive integer")

        rng = request_rng(self.config.seed, body)
        endpoint = self._route(rng, model.endpoints)
        reasoning_cfg = body.get("reasoning")
        reasoning = model.reasoning and not (
            isinstance(reasoning_cfg, dict)
            and (reasoning_cfg.get("enabled") is False or reasoning_cfg.get("effort") == "none")
        )
        comp = generate(
            rng,
            messages=messages,
            tools=body.get("tools") if isinstance(body.get("tools"), list) else None,
            max_tokens=min(max_tokens, endpoint.max_completion_tokens),
            mean_tokens=model.mean_completion_tokens,
            reasoning=reasoning,
        )
        delay = endpoint.ttft_s + comp.completion_tokens / endpoint.tokens_per_s
        if self.config.time_scale > 0:
            await asyncio.sleep(delay * self.config.time_scale)

        prompt_tokens = count_prompt_tokens(messages)
        cost = (
            prompt_tokens * endpoint.prompt_price
            + comp.completion_tokens * endpoint.completion_price
        )
        excluded = isinstance(reasoning_cfg, dict) and reasoning_cfg.get("exclude") is True
        created = int(time.time())
        gen_id = f"gen-{created}-{''.join(rng.choice(_ALNUM) for _ in range(20))}"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": comp.content,
            "refusal": None,
            "reasoning": None if excluded or not comp.reasoning else comp.reasoning,
        }
        if message["reasoning"]:
            message["reasoning_details"] = [
                {"type": "reasoning.text", "text": comp.reasoning, "format": "unknown", "index": 0}
            ]
        if comp.tool_calls:
            message["tool_calls"] = comp.tool_calls
        response = {
            "id": gen_id,
            "object": "chat.completion",
            "created": created,
            "model": model.id,
            "provider": endpoint.provider_name,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": comp.finish_reason,
                    "native_finish_reason": comp.finish_reason,
                    "message": message,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": comp.completion_tokens,
                "total_tokens": prompt_tokens + comp.completion_tokens,
                "cost": round(cost, 12),
                "is_byok": False,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": comp.reasoning_tokens,
                    "image_tokens": 0,
                },
            },
        }
        self._record(
            LoggedRequest(
                time.time(),
                request.path,
                200,
                auth,
                model.id,
                endpoint.provider_name,
                prompt_tokens,
                comp.completion_tokens,
                cost,
                body,
            )
        )
        return web.json_response(response, headers={"X-Generation-Id": gen_id})

    def _reject(self, request: web.Request, status: int, message: str) -> web.Response:
        self._record(
            LoggedRequest(time.time(), request.path, status, request.headers.get("Authorization"))
        )
        return _error(status, message)

    @staticmethod
    def _route(rng: random.Random, endpoints: list[SimEndpoint]) -> SimEndpoint:
        # OpenRouter's default: load-balance by inverse-square price.
        weights = [1.0 / max(e.completion_price + e.prompt_price, 1e-12) ** 2 for e in endpoints]
        return rng.choices(endpoints, weights=weights, k=1)[0]


@dataclass
class RunningSim:
    """A simulator serving on a loopback port."""

    simulator: Simulator
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/api/v1"


async def start_sim(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[RunningSim, web.AppRunner]:
    """Start serving in the running loop; port 0 picks a free port."""
    sim = Simulator(config)
    runner = web.AppRunner(sim.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    return RunningSim(sim, host, bound), runner


@contextmanager
def sim_in_thread(config: SimConfig | None = None, host: str = "127.0.0.1") -> Iterator[RunningSim]:
    """Run a simulator on its own event loop in a daemon thread, for the demo and tests."""
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            running, runner = loop.run_until_complete(start_sim(config or SimConfig(), host))
            ready["sim"], ready["runner"] = running, runner
        except BaseException as exc:  # surfaced to the caller below
            ready["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="regen-sim", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if "error" in ready:
        raise ready["error"]
    try:
        yield ready["sim"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
