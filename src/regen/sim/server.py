"""The simulated OpenRouter-compatible server (aiohttp.web), for the demo, tests and benchmarks.

It follows OpenRouter's documented behaviour, quirks included: provider routing and its 404,
402 for credit (or a created key's limit) that cannot cover `max_tokens`, 429 with
Retry-After above an endpoint's capacity, a non-streamed answer's status and headers sent at
once and whitespace padding until its body, errors inside HTTP 200 bodies, SSE keep-alive
comments, a usage chunk after the finish chunk, /generation that lags behind completion, and
usage billed per key (keys.py: the key management API).

Never imported by the runtime path: only the CLI (`regen sim`, `regen demo`), tests and
benchmarks use it.
"""

from __future__ import annotations

import asyncio
import json
import string
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from regen.sim.account import Account, affordable
from regen.sim.auth import authorize
from regen.sim.caching import PromptBill, ProviderCaches, conversation_key, prompt_bill
from regen.sim.catalogue import Catalogue
from regen.sim.config import REQUEST_PARAMETERS, SimConfig, SimEndpoint, SimModel
from regen.sim.faults import draw_faults, forced_faults
from regen.sim.generate import (
    Completion,
    generate,
    prompt_token_ids,
    request_digest,
    rng_for,
)
from regen.sim.keys import KeysApi, KeyStore
from regen.sim.prefix_cache import NO_CACHE, CacheUse, SimClock
from regen.sim.respond import error_response, respond_json, respond_stream
from regen.sim.routing import route

_ALNUM = string.ascii_letters + string.digits


@dataclass
class LoggedRequest:
    """What the simulator saw and answered, for tests and benchmarks to check."""

    at: float
    path: str
    status: int
    authorization: str | None
    """The request's Authorization header as sent (None without one)."""
    key: str | None = None
    """The accepted bearer key the request was made with: its bills are charged to it."""
    model: str | None = None
    provider: str | None = None
    endpoint_tag: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens read from the serving endpoint's (or server's) prefix cache."""
    cache_write_tokens: int = 0
    """Prompt tokens billed as cache writes (OpenRouter providers that bill them)."""
    ttft_s: float = 0.0
    """Simulated seconds to the first token: the endpoint's `ttft_s` and the prefill of the
    prompt tokens not found in a prefix cache."""
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """What the account was charged (0 when not billed)."""
    billed: bool = False
    billed_at: float | None = None
    """When the bill was made (wall clock): when the generation ended, client there or not."""
    stream: bool = False
    faults: tuple[str, ...] = ()
    generation_id: str | None = None
    digest: str | None = None
    """Hex digest of the request's content: equal for a retry of the same request."""
    body: dict[str, Any] | None = None
    """The request body, kept only with `log_bodies = true`."""
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    """The token ids a self-hosted server generated, kept only with `log_bodies = true`."""
    choices: int = 1
    """Choices generated from the prompt (a self-hosted server's `n`)."""
    choice_ids: list[list[int]] | None = None
    """Each choice's token ids (with `log_bodies = true`)."""
    since: float = 0.0
    """The loop time the answer's simulated time counts from (`respond.Paced`): when the
    request arrived, later by a wait the simulator means (a hold, a queue for a slot)."""
    late_s: float | None = None
    """How late its whole answer went out past when it was due: the simulator's own work
    outrunning the answers' time (None: not a whole answer)."""


@dataclass(frozen=True)
class _Chat:
    """A validated chat request, with its faults and its place among repeats of itself."""

    entry: LoggedRequest
    key: str
    model: SimModel
    messages: list[Any]
    tools: list[Any]
    max_tokens: int
    thinking: bool
    faults: set[str]
    digest: bytes
    occurrence: int
    reasoning_shown: bool
    prompt_ids: list[int]
    conversation: str | None
    """The sticky-routing key (caching.py); None with `provider.order`."""


class Simulator:
    """State shared by the handlers: config, account, in-flight counts and the request log."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.account = Account(config.credits_usd)
        self.keys = KeyStore(config.seed)
        """Keys created through the management API (`/api/v1/keys`)."""
        self.log: list[LoggedRequest] = []
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.peak_in_flight = 0
        """The most requests served at once, over all endpoints."""
        self._seen: Counter[bytes] = Counter()
        self.unbilled = 0
        """Answers still generating that will be billed when they end (a client that went away
        does not stop them)."""
        self._changed = threading.Condition()
        """Notified when an answer is billed or a held request starts or stops waiting."""
        self._hold: _Hold | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bucket = (float(config.global_rps or 0), time.monotonic())
        self._cpu: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        """One request's work (`_turn`) per pass of the event loop (a lock of the loop the
        simulator serves in)."""
        self.clock = SimClock(config.time_scale)
        """Simulated time, for cache lifetimes and sticky routes (`clock.advance` in tests)."""
        self.caches = ProviderCaches(config.sticky_s)
        self.prefill_tokens: Counter[str] = Counter()
        """Prompt tokens computed (not read from a prefix cache), by endpoint tag."""
        self.cached_tokens: Counter[str] = Counter()
        """Prompt tokens read from a prefix cache, by endpoint tag."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self._started)
        for prefix in ("/api/v1", "/v1"):
            app.router.add_post(f"{prefix}/chat/completions", self.chat_completions)
        Catalogue(self.config, self.account, self.keys).add_routes(app)
        KeysApi(self.config, self.account, self.keys).add_routes(app)
        app.router.add_get("/_sim/stats", self.stats)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        """What the simulator served (not an OpenRouter route: for benchmarks that run it as
        its own process). `distinct_billed` counts billed requests of distinct content, so
        `billed - distinct_billed` is answers paid for twice."""
        chats = self.chat_log()
        billed = [e for e in chats if e.billed]
        return web.json_response(
            {
                "chat_requests": len(chats),
                "by_status": {
                    str(k): v for k, v in sorted(Counter(e.status for e in chats).items())
                },
                "billed": len(billed),
                "distinct_billed": len({e.digest for e in billed}),
                "billed_usd": self.billed_usd(),
                "unbilled": self.unbilled,
                "peak_in_flight": self.peak_in_flight,
                "prefill_tokens": sum(self.prefill_tokens.values()),
                "cached_tokens": sum(self.cached_tokens.values()),
                "prefill_tokens_by_endpoint": dict(self.prefill_tokens),
                "cached_tokens_by_endpoint": dict(self.cached_tokens),
                "late": late_answers(chats),
            }
        )

    def count_prefill(self, tag: str, prompt_tokens: int, use: CacheUse) -> None:
        """Count a prompt that reached the model: what was computed and what was read."""
        self.prefill_tokens[tag] += prompt_tokens - use.cached
        self.cached_tokens[tag] += use.cached

    def billed_usd(self) -> float:
        """What the whole account was billed so far."""
        return self.account.used_usd

    def billed_by_key(self) -> dict[str, float]:
        """What each key (the bearer string) was billed so far, answers still generating not
        counted; a deleted key keeps its total."""
        return {key: usage.total for key, usage in self.account.by_key.items()}

    def wait_billed(self, timeout: float = 30.0) -> bool:
        """Wait (from another thread) until every answer still generating has been billed;
        False if some were not within `timeout`."""
        return self.wait_until(lambda: self.unbilled == 0, timeout)

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Wait (from another thread) until `predicate()` holds, checked whenever an answer is
        billed or a held request starts or stops waiting; False after `timeout`."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def hold(self, after: int = 0, until_held: int | None = None) -> None:
        """A test's hook to fix the moment it acts on: requests past the next `after` are
        received, routed and counted in flight, then wait before they are answered, until
        `release()` or until `until_held` of them wait. Call it before they arrive."""
        self._hold = _Hold(after, until_held)

    def release(self) -> None:
        """Answer the held requests, and hold no more."""
        hold, self._hold = self._hold, None
        if hold is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(hold.open.set)

    @property
    def held(self) -> int:
        """Requests waiting at the hold now."""
        hold = self._hold
        return hold.waiting if hold is not None else 0

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    async def _started(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()

    async def _pass_hold(self, entry: LoggedRequest) -> None:
        hold = self._hold
        if hold is None or hold.open.is_set():
            return
        if hold.passed < hold.after:
            hold.passed += 1
            return
        hold.waiting += 1
        if hold.until_held is not None and hold.waiting >= hold.until_held:
            hold.open.set()
        self._notify()
        loop = asyncio.get_running_loop()
        held = loop.time()
        try:
            await hold.open.wait()
        finally:
            hold.waiting -= 1
            entry.since += loop.time() - held  # its time counts from when it was let through
            self._notify()

    def _billed(self, cost: float, key: str) -> None:
        with self._changed:
            self.account.charge(cost, key)
            self.unbilled -= 1
            self._changed.notify_all()

    def chat_log(self) -> list[LoggedRequest]:
        return [e for e in self.log if e.path.endswith("/chat/completions")]

    def _take_rps_token(self) -> bool:
        rps = self.config.global_rps
        if rps is None:
            return True
        tokens, last = self._bucket
        now = time.monotonic()
        tokens = min(max(1.0, rps), tokens + (now - last) * rps)
        if tokens < 1.0:
            self._bucket = (tokens, now)
            return False
        self._bucket = (tokens - 1.0, now)
        return True

    async def _turn(self) -> None:
        """Wait for this request's turn to be worked on (read, rendered, tokenized, its answer
        made: what runs until its answer's first wait): one request's work per pass of the
        event loop, the lock given back at the next pass. Between two, the loop reads what
        has arrived, so a request that comes while a burst is being worked on notes its
        arrival (`since`) then, not after the whole burst, and answers go out when due."""
        loop = asyncio.get_running_loop()
        if self._cpu is None or self._cpu[0] is not loop:
            self._cpu = (loop, asyncio.Lock())
        lock = self._cpu[1]
        await lock.acquire()
        loop.call_soon(lock.release)

    async def _sleep(self, entry: LoggedRequest, seconds: float) -> float:
        """Until `seconds` (simulated) after the request's `since`; how late it woke."""
        loop = asyncio.get_running_loop()
        due = entry.since + seconds * self.config.time_scale
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        return max(0.0, loop.time() - due)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        entry = LoggedRequest(time.time(), request.path, 0, request.headers.get("Authorization"))
        entry.since = asyncio.get_running_loop().time()
        self.log.append(entry)
        # Requests that came together each note when they came before any is rendered and
        # tokenized (the simulator's CPU, which no answer's time should include).
        await asyncio.sleep(0)
        await self._turn()
        try:
            response = await self._chat(request, entry)
        except ConnectionResetError:  # the client went away mid-answer (aiohttp's is one too)
            entry.status = 499  # as nginx logs it; the answer stays billed if it was
            return web.Response(status=499)
        entry.status = response.status
        return response

    async def _chat(self, request: web.Request, entry: LoggedRequest) -> web.StreamResponse:
        key = authorize(self.config, self.keys, request, completions=True)
        if isinstance(key, web.Response):
            return key
        entry.key = key
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "Invalid JSON body")
        if not isinstance(body, dict):
            return error_response(400, "Body must be a JSON object")
        entry.stream = bool(body.get("stream"))
        if self.config.log_bodies:
            entry.body = body
        model = self.config.model(str(body.get("model")))
        if model is None:
            return error_response(
                400,
                f"{body.get('model')} is not a valid model ID",
                availability={"code": "model_not_found", "retryable": False},
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error_response(400, "messages must be a non-empty list")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = max(e.max_completion_tokens for e in model.endpoints)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return error_response(400, "max_tokens must be a positive integer")
        forced = forced_faults(request.headers.get("X-Sim-Fault"))
        if isinstance(forced, str):
            return error_response(400, forced)
        if not self._take_rps_token():
            reset = str(int((time.time() + 1) * 1000))
            return error_response(
                429,
                "Rate limit exceeded: too many requests per second",
                headers={
                    "X-RateLimit-Limit": str(self.config.global_rps),
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": reset,
                },
                metadata={"error_type": "rate_limit_exceeded"},
            )

        digest = request_digest(self.config.seed, body)
        entry.digest = digest.hex()
        occurrence = self._seen[digest]
        self._seen[digest] += 1
        fault_rng = rng_for(digest, occurrence, 1)
        faults = (
            forced
            if request.headers.get("X-Sim-Fault")
            else draw_faults(self.config.faults, fault_rng)
        )
        entry.faults = tuple(sorted(faults))

        raw_reasoning = body.get("reasoning")
        reasoning_cfg: dict[str, Any] = raw_reasoning if isinstance(raw_reasoning, dict) else {}
        thinking = model.reasoning and not (
            reasoning_cfg.get("enabled") is False or reasoning_cfg.get("effort") == "none"
        )
        raw_tools = body.get("tools")
        tools: list[Any] = raw_tools if isinstance(raw_tools, list) else []
        try:
            prompt_ids = prompt_token_ids(model.family, messages, tools, thinking)
        except Exception as exc:  # noqa: BLE001 - any history the template cannot render
            return error_response(400, f"chat template error: {exc}")
        prompt_tokens = entry.prompt_tokens = len(prompt_ids)
        params = {p for p in REQUEST_PARAMETERS if p in body}
        candidates = route(
            model.endpoints,
            body.get("provider"),
            max_tokens=max_tokens,
            params=params,
            rng=rng_for(digest, occurrence, 2),
        )
        if not candidates.endpoints:
            return error_response(
                404,
                "No endpoints found matching your data policy and routing requirements",
                availability={
                    "code": "constraint_filtered",
                    "retryable": False,
                    "requested_models": [model.id],
                    "excluded_by": candidates.excluded_by,
                    "constraint": candidates.constraint,
                },
            )

        conversation = conversation_key(body, request.headers.get("x-session-id"))
        sticky = self.caches.sticky(model.id, conversation, self.clock.now())
        candidates.endpoints.sort(key=lambda e: e.tag != sticky)  # stable: the rest keep order
        first = candidates.endpoints[0]
        affordable = self.account.affordable_tokens(
            prompt_tokens * first.prompt_price, first.completion_price
        )
        remaining = self.account.remaining_usd
        if remaining is not None and (remaining <= 0 or (affordable or 0) < max_tokens):
            return error_response(
                402,
                f"This request requires more credits, or fewer max_tokens. You requested up to "
                f"{max_tokens} tokens, but can only afford {affordable or 0}. To increase, visit "
                "https://openrouter.ai/settings/credits and add more credits",
                metadata={"provider_name": None},
            )
        refused = self._over_key_limit(key, prompt_tokens, max_tokens, first)
        if refused is not None:
            return refused

        endpoint = next(
            (
                e
                for e in candidates.endpoints
                if e.capacity == 0 or self.in_flight[e.tag] < e.capacity
            ),
            None,
        )
        if "misroute" in faults:
            leaked = [e for e in model.endpoints if e not in candidates.endpoints]
            endpoint = leaked[0] if leaked else endpoint
        if endpoint is None or "429" in faults:
            busy = endpoint or first
            return error_response(
                429,
                "Provider returned error",
                headers={"Retry-After": f"{self.config.retry_after_s:g}"},
                metadata={
                    "raw": f"{model.id} is temporarily rate-limited upstream. "
                    "Please retry shortly.",
                    "provider_name": busy.provider_name,
                    "error_type": "capacity_exhausted",
                },
            )
        self.in_flight[endpoint.tag] += 1
        self.max_in_flight[endpoint.tag] = max(
            self.max_in_flight[endpoint.tag], self.in_flight[endpoint.tag]
        )
        self.peak_in_flight = max(self.peak_in_flight, sum(self.in_flight.values()))
        chat = _Chat(
            entry,
            key,
            model,
            messages,
            tools,
            max_tokens,
            thinking,
            faults,
            digest,
            occurrence,
            not reasoning_cfg.get("exclude"),
            prompt_ids,
            conversation,
        )
        try:
            await self._pass_hold(entry)
            return await self._serve(request, chat, endpoint)
        finally:
            self.in_flight[endpoint.tag] -= 1

    def _over_key_limit(
        self, key: str, prompt_tokens: int, max_tokens: int, first: SimEndpoint
    ) -> web.Response | None:
        """The 402 for a created key whose limit, less what the key was billed so far, cannot
        pay for the prompt and `max_tokens` at the first candidate endpoint's prices. As on
        OpenRouter, requests still generating are not counted: they are billed when they end,
        so a key's usage can pass its limit by what was in flight when it was reached."""
        managed = self.keys.of_secret(key)
        if managed is None or managed.limit is None:
            return None
        remaining = managed.remaining(self.account.usage_record(key))
        assert remaining is not None
        can = affordable(remaining, prompt_tokens * first.prompt_price, first.completion_price)
        if remaining > 0 and can >= max_tokens:
            return None
        return error_response(
            402,
            f"This request requires more credits, or fewer max_tokens. You requested up to "
            f"{max_tokens} tokens, but can only afford {can}. To increase, visit "
            "https://openrouter.ai/settings/keys and create a key with a higher limit",
            metadata={"provider_name": None},
        )

    def _cache_and_price(self, chat: _Chat, endpoint: SimEndpoint) -> PromptBill:
        """The prompt reaches the endpoint: read what its cache holds (and store the rest),
        keep the conversation there, count the prefill and its time, and price it."""
        entry, model = chat.entry, chat.model
        now = self.clock.now()
        cache = self.config.cache_of(endpoint)
        use = NO_CACHE
        if cache is not None:
            ready = computed_by(self.clock, endpoint)
            use = self.caches.use(model.id, endpoint, cache, chat.prompt_ids, now, ready)
            self.caches.stick(model.id, chat.conversation, endpoint, cache, now)
        self.count_prefill(endpoint.tag, entry.prompt_tokens, use)
        prompt = prompt_bill(entry.prompt_tokens, endpoint, cache, use)
        entry.cached_tokens, entry.cache_write_tokens = prompt.cached, prompt.written
        entry.ttft_s = endpoint.ttft_s + prefill_s(endpoint, entry.prompt_tokens - use.cached)
        return prompt

    async def _serve(
        self, request: web.Request, chat: _Chat, endpoint: SimEndpoint
    ) -> web.StreamResponse:
        entry, model, faults = chat.entry, chat.model, chat.faults
        digest, occurrence = chat.digest, chat.occurrence
        entry.model, entry.provider, entry.endpoint_tag = (
            model.id,
            endpoint.provider_name,
            endpoint.tag,
        )
        for code in ("500", "502", "503", "524", "529", "408"):
            if code in faults:
                await self._sleep(entry, endpoint.ttft_s)
                return error_response(
                    int(code),
                    {
                        "408": "Request timed out",
                        "500": "Internal Server Error",
                        "524": "Provider timed out",
                    }.get(code, "Provider returned error"),
                    metadata={"provider_name": endpoint.provider_name},
                )

        try:
            comp = generate(
                rng_for(digest),
                family=model.family,
                messages=chat.messages,
                tools=chat.tools,
                max_tokens=min(chat.max_tokens, endpoint.max_completion_tokens),
                mean_tokens=model.mean_completion_tokens,
                thinking=chat.thinking,
            )
        except Exception as exc:  # noqa: BLE001 - a history the template cannot answer: a 400
            return error_response(400, f"chat template error: {exc}")
        if "cold_start" in faults:
            comp = Completion("", "", [], 0, 0, "stop", [])
        prompt = self._cache_and_price(chat, endpoint)
        ttft_s = entry.ttft_s
        created = int(time.time())
        id_rng = rng_for(digest, occurrence, 3)
        gen_id = f"gen-{created}-{''.join(id_rng.choice(_ALNUM) for _ in range(20))}"
        entry.generation_id = gen_id
        prompt_cost = prompt.cost_usd
        cost = prompt_cost + comp.completion_tokens * endpoint.completion_price
        # Zero-completion insurance: nothing generated, or an error finish, is not billed.
        billed = (
            comp.completion_tokens > 0
            and "error_200" not in faults
            and "midstream_error" not in faults
        )
        usage = {
            "prompt_tokens": entry.prompt_tokens,
            "completion_tokens": comp.completion_tokens,
            "total_tokens": entry.prompt_tokens + comp.completion_tokens,
            "cost": round(cost, 12) if billed else 0,
            "is_byok": False,
            "prompt_tokens_details": {
                "cached_tokens": prompt.cached,
                "cache_write_tokens": prompt.written,
                "audio_tokens": 0,
                "video_tokens": 0,
            },
            "cost_details": {
                "upstream_inference_cost": None,
                "upstream_inference_prompt_cost": round(prompt_cost, 12),
                "upstream_inference_completions_cost": round(cost - prompt_cost, 12),
            },
            "completion_tokens_details": {
                "reasoning_tokens": comp.reasoning_tokens,
                "image_tokens": 0,
                "audio_tokens": 0,
            },
        }
        meta = {
            "id": gen_id,
            "provider": endpoint.provider_name,
            "model": model.id,
            "created": created,
            "system_fingerprint": None,
        }
        shown = chat.reasoning_shown
        # The answer is billed when its generation finishes, whether or not the client is
        # still there to read it (OpenRouter keeps generating after a disconnect).
        bill = _Bill(self, cost if billed else None, chat.key, entry)
        generating_s = ttft_s + comp.completion_tokens / endpoint.tokens_per_s
        loop = asyncio.get_running_loop()
        ends_at = entry.since + generating_s * self.config.time_scale
        if billed:
            entry.billed, entry.cost_usd = True, cost
            self.unbilled += 1
            loop.call_at(ends_at, bill.fire)
        entry.completion_tokens = comp.completion_tokens
        # Its /generation record shows `generation_delay_s` after the generation ends (the
        # id is known sooner: in the headers, in a stream's first chunk).
        self.account.record(
            gen_id,
            {
                "id": gen_id,
                "model": model.id,
                "provider_name": endpoint.provider_name,
                "streamed": entry.stream,
                "cancelled": False,
                # Zero-completion insurance: a generation that ended in an error is not
                # billed, and its record says why.
                "finish_reason": comp.finish_reason
                if billed or not comp.completion_tokens
                else "error",
                "native_finish_reason": comp.finish_reason,
                "created_at": created,
                "latency": ttft_s * 1000,
                "generation_time": comp.completion_tokens / endpoint.tokens_per_s * 1000,
                "tokens_prompt": entry.prompt_tokens,
                "tokens_completion": comp.completion_tokens,
                "native_tokens_prompt": entry.prompt_tokens,
                "native_tokens_completion": comp.completion_tokens,
                "native_tokens_reasoning": comp.reasoning_tokens,
                "native_tokens_cached": prompt.cached,
                "total_cost": cost if billed else 0,
                "cache_discount": round(prompt.discount_usd, 12) if billed else 0,
                "usage": cost if billed else 0,
                "is_byok": False,
                "provider_responses": [
                    {
                        "provider_name": endpoint.provider_name,
                        "status": 200,
                        "endpoint_id": endpoint.tag,
                    }
                ],
            },
            max(0.0, ends_at - loop.time()),
        )
        answer = (self.config, request, meta, comp, usage, faults)
        if entry.stream:
            resp = await respond_stream(*answer, endpoint, shown, entry, bill.fire, ttft_s)
        else:
            # Status and headers go out now; padding while the answer is generated.
            resp = await respond_json(*answer, shown, generating_s, entry, bill.fire)
        if "reset" not in faults:
            bill.fire()  # the whole answer went out: its generation is over (a no-op if done)
        return resp


def late_answers(chats: list[LoggedRequest]) -> dict[str, float]:
    """How well the simulator kept its answers' time: of the whole answers it timed, how
    many went out late, by more than 50 ms, their mean and the worst. Late answers mean its
    own work (one core) outran the answers' time: a bench's times are then partly the
    simulator's, not the simulated provider's."""
    late = sorted(e.late_s for e in chats if e.late_s is not None)
    return {
        "answers": len(late),
        "over_50ms": sum(s > 0.05 for s in late),
        "mean_s": sum(late) / len(late) if late else 0.0,
        "worst_s": late[-1] if late else 0.0,
    }


def prefill_s(endpoint: SimEndpoint, computed_tokens: int) -> float:
    """Simulated seconds to compute a prompt's uncached tokens (0 without a prefill speed)."""
    rate = endpoint.prefill_tokens_per_s
    return computed_tokens / rate if rate > 0 else 0.0


def computed_by(clock: SimClock, endpoint: SimEndpoint) -> Callable[[int], float]:
    """When a prompt that computes so many tokens on the endpoint has been computed (its time
    to first token from now): what it writes to a prefix cache is readable from then on."""
    return lambda computed: clock.after(endpoint.ttft_s + prefill_s(endpoint, computed))


@dataclass
class _Hold:
    """Requests held before they are answered (`Simulator.hold`)."""

    after: int
    until_held: int | None
    passed: int = 0
    waiting: int = 0
    open: asyncio.Event = field(default_factory=asyncio.Event)


class _Bill:
    """One answer's charge, made once: when its generation finishes or its answer is sent.
    `cost` None: an answer that is not billed."""

    __slots__ = ("sim", "cost", "key", "done", "entry")

    def __init__(self, sim: Simulator, cost: float | None, key: str, entry: LoggedRequest) -> None:
        self.sim, self.cost, self.key, self.done, self.entry = sim, cost, key, False, entry

    def fire(self) -> None:
        if not self.done:
            self.done = True
            if self.cost is not None:  # a free endpoint's answer too: it is no longer unbilled
                self.entry.billed_at = time.time()
                self.sim._billed(self.cost, self.key)


@dataclass
class RunningSim:
    """A simulator serving on a loopback port."""

    simulator: Simulator
    host: str
    port: int

    @property
    def base_url(self) -> str:
        path = "/api/v1" if self.simulator.config.dialect == "openrouter" else "/v1"
        return f"http://{self.host}:{self.port}{path}"


async def start_sim(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[RunningSim, web.AppRunner]:
    """Start serving in the running loop; port 0 picks a free port."""
    sim: Simulator
    if config.dialect == "openrouter":
        sim = Simulator(config)
    else:
        from regen.sim.selfhosted import SelfHostedSim

        sim = SelfHostedSim(config)
    runner = web.AppRunner(sim.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    if config.dialect == "vllm" and config.loading_s:
        # vLLM loads the model before it serves: until then its port refuses connections.
        await asyncio.sleep(config.loading_s)
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
