"""A simulated self-hosted server: one vLLM or SGLang process serving one model through its
OpenAI-compatible API (`regen sim --dialect vllm|sglang`).

What differs from the OpenRouter dialect, as each server documents and implements it:
- one model (`--served-model-name`); `/v1/models`, `/health`; no `/key`, `/credits` or
  `/generation`; no `provider` and no `cost` anywhere;
- `chat_template_kwargs` reaches the chat template (the thinking switch of Qwen3,
  Qwen3.5, GLM, Kimi);
- token ids on request: vLLM's `return_token_ids` puts `prompt_token_ids` on the response
  (in a stream: on the first chunk) and `token_ids` on each choice (in a stream: each chunk's
  share); SGLang's `return_prompt_token_ids` and `return_token_ids` put both on the choice and
  are refused on streams;
- reasoning as `reasoning` (vLLM) or `reasoning_content` (SGLang, which also counts
  `usage.reasoning_tokens`); tool calls as the servers' tool parsers return them;
- usage in a stream only with `stream_options.include_usage` (a last chunk with no choices),
  and on every chunk with `continuous_usage_stats`;
- errors in each server's own shape: vLLM `{"error": {message, type, param, code}}`, SGLang
  the flat `{"object": "error", message, type, param, code}`;
- a full server queues (latency grows) instead of answering 429; while its weights load,
  vLLM does not listen yet (connections are refused) and SGLang answers 503.
Faults as in the OpenRouter dialect where a server can show them: 5xx, a cut connection, a
stall, a mid-stream error. A crash is the process being killed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from regen.sim.chat import SWITCH, WRITES_CALL_IDS, render_prompt
from regen.sim.config import SimConfig, SimModel
from regen.sim.faults import draw_faults, forced_faults
from regen.sim.generate import Completion, generate, request_digest, rng_for
from regen.sim.prefix_cache import NO_CACHE, PrefixCache
from regen.sim.respond import Paced
from regen.sim.server import LoggedRequest, Simulator, computed_by, prefill_s
from regen.sim.stream import pieces
from regen.sim.tokens import encode_prompt

# The kinds of fault a self-hosted server can show (no routing, billing or proxy quirks).
_FAULTS = frozenset({"500", "502", "503", "reset", "stall", "midstream_error"})
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    500: "InternalServerError",
    502: "BadGateway",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answer, in the dialect's shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class Refused(Exception):
    """Fields of a request that the server's strict validation refuses (422)."""

    def __init__(self, fields: list[str]) -> None:
        super().__init__(", ".join(fields))
        self.fields = fields


@dataclass(frozen=True)
class _Ask:
    """A validated request."""

    model: SimModel
    messages: list[Any]
    tools: list[Any]
    max_tokens: int
    thinking: bool
    stream: bool
    token_ids: bool
    prompt_ids: bool
    include_usage: bool
    continuous_usage: bool
    include_reasoning: bool
    prompt: list[int]
    faults: set[str]
    digest: bytes
    occurrence: int
    n: int = 1
    """Choices to generate from the one prompt (vLLM's and SGLang's `n`; one prefill)."""
    cached: int = 0
    """Prompt tokens found in the server's prefix cache (set when the request is served)."""
    ttft_s: float = 0.0
    """Time to its first token: the server's, and the prefill of its uncached tokens."""


class SelfHostedSim(Simulator):
    """vLLM (`dialect = "vllm"`) or SGLang (`"sglang"`) serving `served_model`."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        model = config.model(config.served_model) if config.served_model else config.models[0]
        if model is None:
            raise ValueError(f"served_model {config.served_model!r} is not among the models")
        self.served = model
        self.dialect = config.dialect
        self.started = time.monotonic()
        self.queued = 0
        """Requests waiting for a slot (above max_num_seqs)."""
        self._slots: asyncio.Semaphore | None = None
        block = config.prefix_block_tokens or (16 if self.dialect == "vllm" else 1)
        self.prefix_cache = (
            PrefixCache(block, config.prefix_cache_tokens, None) if config.prefix_caching else None
        )
        """Automatic prefix caching: vLLM's 16-token blocks, SGLang's radix tree of one-token
        pages, kept until evicted (LRU) by what the KV cache cannot hold."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        if self.config.health_route:
            app.router.add_get("/health", self.health)
        if self.dialect == "sglang":
            app.router.add_get("/health_generate", self.health)
            app.router.add_get("/model_info", self.model_info)
            app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/_sim/stats", self.stats)
        return app

    @property
    def loading(self) -> bool:
        return time.monotonic() - self.started < self.config.loading_s

    # side routes ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.loading else 200)

    async def models(self, request: web.Request) -> web.Response:
        if self.loading:
            return self._error(ApiError(503, "The server is still loading the model"))
        card: dict[str, Any] = {
            "id": self.served.id,
            "object": "model",
            "created": int(time.time()),
            "owned_by": self.dialect,
            "root": self.served.id,
            "parent": None,
            "max_model_len": self.served.context_length,
        }
        if self.dialect == "vllm":
            card["permission"] = [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": card["created"],
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ]
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.served.id, "tokenizer_path": self.served.id, "is_generation": True}
        )

    # errors --------------------------------------------------------------------------------

    def _error(self, err: ApiError) -> web.Response:
        info = {
            "message": err.message,
            "type": _ERROR_TYPES.get(err.status, "BadRequestError"),
            "param": err.param,
            "code": err.status,
        }
        body = {"object": "error", **info} if self.dialect == "sglang" else {"error": info}
        return web.json_response(body, status=err.status)

    # chat ----------------------------------------------------------------------------------

    async def _chat(self, request: web.Request, entry: LoggedRequest) -> web.StreamResponse:
        if self.config.api_keys:  # `--api-key`: every request must carry one of them
            header = request.headers.get("Authorization", "")
            if header.removeprefix("Bearer ").strip() not in self.config.api_keys:
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            ask = self._validate(request, await request.read(), entry)
        except ApiError as err:
            return self._error(err)
        except Refused as err:  # FastAPI's own validation error: `detail`, one per field
            detail = [
                {
                    "type": "extra_forbidden",
                    "loc": ["body", name],
                    "msg": "Extra inputs are not permitted",
                    "input": True,
                }
                for name in err.fields
            ]
            return web.json_response({"detail": detail}, status=422)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.max_num_seqs)
        self.queued += 1
        loop = asyncio.get_running_loop()
        queued = loop.time()
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
            entry.since += loop.time() - queued  # its time counts from when it has a slot
        tag = self.served.endpoints[0].tag
        self.in_flight[tag] += 1
        self.max_in_flight[tag] = max(self.max_in_flight[tag], self.in_flight[tag])
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight[tag])
        try:
            return await self._serve_ask(request, ask, entry)
        finally:
            self.in_flight[tag] -= 1
            self._slots.release()

    def _validate(self, request: web.Request, raw: bytes, entry: LoggedRequest) -> _Ask:
        if self.loading:
            raise ApiError(503, "The server is still loading the model")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"JSON decode error: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if self.config.log_bodies:
            entry.body = body
        stream = bool(body.get("stream"))
        entry.stream = stream
        refused = [f for f in self.config.refuse_fields if f in body]
        if refused:
            raise Refused(refused)
        name = body.get("model")
        if self.dialect == "vllm" and name not in (None, "", self.served.id):
            raise ApiError(404, f"The model `{name}` does not exist.", "model")
        # SGLang does not check the name: it answers with the model named in the request.
        entry.model = str(name) if self.dialect == "sglang" and name else self.served.id
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: a non-empty list is required", "messages")
        sglang = self.dialect == "sglang"
        want_ids = bool(body.get("return_token_ids"))
        want_prompt_ids = bool(body.get("return_prompt_token_ids")) if sglang else want_ids
        if sglang and stream and want_ids:
            raise ApiError(
                400,
                "return_token_ids is not supported with streaming on /v1/chat/completions. "
                "Please set stream=false when using return_token_ids=true.",
            )
        if sglang and stream and want_prompt_ids:
            raise ApiError(
                400,
                "return_prompt_token_ids is not supported with streaming. Please set "
                "stream=false when using return_prompt_token_ids=true.",
            )
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise ApiError(400, "max_tokens must be at least 1", "max_tokens")
        kwargs = body.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        switch = SWITCH.get(self.served.family)
        thinking = self.served.reasoning
        reasoning = body.get("reasoning")
        off = isinstance(reasoning, dict) and (
            reasoning.get("enabled") is False or reasoning.get("effort") == "none"
        )
        if sglang and off:  # SGLang maps OpenRouter's object to the template's switch too
            thinking = False
        if switch is not None and switch in kwargs:
            thinking = bool(kwargs[switch])
        raw_tools = body.get("tools")
        tools: list[Any] = raw_tools if isinstance(raw_tools, list) else []
        try:
            text = render_prompt(self.served.family, messages, tools, thinking)
        except Exception as exc:  # noqa: BLE001 - any history the template cannot render
            raise ApiError(400, f"chat template error: {exc}") from exc
        prompt = encode_prompt()(text)
        entry.prompt_tokens = len(prompt)
        context = self.served.context_length
        if max_tokens is None:
            max_tokens = max(1, context - len(prompt))
        if len(prompt) + max_tokens > context:
            raise self._too_long(len(prompt), max_tokens, context)
        forced = forced_faults(request.headers.get("X-Sim-Fault"))
        if isinstance(forced, str):
            raise ApiError(400, forced)
        digest = request_digest(self.config.seed, body)
        entry.digest = digest.hex()
        occurrence = self._seen[digest]
        self._seen[digest] += 1
        faults = forced or draw_faults(self.config.faults, rng_for(digest, occurrence, 1))
        faults &= _FAULTS
        entry.faults = tuple(sorted(faults))
        n = body.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ApiError(400, "n must be at least 1", "n")
        if self.config.ignore_n:
            n = 1
        if n > 1 and stream:
            raise ApiError(400, "the simulator does not stream n > 1 (vLLM would)", "n")
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        return _Ask(
            n=n,
            model=self.served,
            messages=messages,
            tools=tools,
            max_tokens=max_tokens,
            thinking=thinking,
            stream=stream,
            token_ids=want_ids,
            prompt_ids=want_prompt_ids,
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
            include_reasoning=body.get("include_reasoning", True) is not False
            and body.get("separate_reasoning", True) is not False,
            prompt=prompt,
            faults=faults,
            digest=digest,
            occurrence=occurrence,
        )

    def _too_long(self, prompt: int, max_tokens: int, context: int) -> ApiError:
        """Each server's words for a request past the model's context."""
        if self.dialect == "vllm":
            return ApiError(
                400,
                f"You passed {prompt} input tokens and requested {max_tokens} output tokens. "
                f"However, the model's context length is only {context} tokens, resulting in a "
                f"maximum input length of {context - max_tokens} tokens. Please reduce the "
                f"length of the input prompt. (parameter=input_tokens, value={prompt})",
                "input_tokens",
            )
        return ApiError(
            400,
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {prompt + max_tokens} tokens: "
            f"{prompt} tokens from the input messages and {max_tokens} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.",
        )

    async def _serve_ask(
        self, request: web.Request, ask: _Ask, entry: LoggedRequest
    ) -> web.StreamResponse:
        speed = ask.model.endpoints[0]
        for code in ("500", "502", "503"):
            if code in ask.faults:
                await self._sleep(entry, speed.ttft_s)
                return self._error(ApiError(int(code), "The engine failed to generate a response"))
        await self._turn()  # the prompt was worked on before it waited for a slot
        ask = self._prefill(ask, entry)
        try:
            # Choice 0 is what a request without n gets; each further choice is its own draw
            # from the same prompt (one prefill: the prompt is counted once).
            comps = [
                generate(
                    rng_for(ask.digest) if k == 0 else rng_for(ask.digest, k, 7),
                    family=ask.model.family,
                    messages=ask.messages,
                    tools=ask.tools,
                    max_tokens=ask.max_tokens,
                    mean_tokens=ask.model.mean_completion_tokens,
                    thinking=ask.thinking,
                )
                for k in range(ask.n)
            ]
        except Exception as exc:  # noqa: BLE001 - a history the template cannot answer
            return self._error(ApiError(400, f"chat template error: {exc}"))
        comp = comps[0]
        entry.completion_tokens = sum(c.completion_tokens for c in comps)
        entry.choices = ask.n
        if self.config.log_bodies:
            entry.prompt_ids, entry.completion_ids = ask.prompt, comp.ids
            entry.choice_ids = [c.ids for c in comps]
        entry.billed = True  # the GPU did the work, whether or not the client gets it
        hex_id = f"{rng_for(ask.digest, ask.occurrence, 3).getrandbits(128):032x}"
        gen_id = f"chatcmpl-{hex_id}" if self.dialect == "vllm" else hex_id
        meta: dict[str, Any] = {
            "id": gen_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": entry.model,
        }
        entry.generation_id = gen_id
        calls = _calls(comp, self.dialect, ask.model.family)
        if ask.stream:
            return await self._stream(request, ask, meta, comp, calls, entry)
        longest = max(c.completion_tokens for c in comps)
        entry.late_s = await self._sleep(entry, ask.ttft_s + longest / speed.tokens_per_s)
        body = self._body(ask, meta, comp, calls)
        if ask.n > 1:
            body["choices"] = [
                {
                    **self._body(ask, meta, c, _calls(c, self.dialect, ask.model.family))[
                        "choices"
                    ][0],
                    "index": k,
                }
                for k, c in enumerate(comps)
            ]
            body["usage"] = self._usage(ask, comps, entry.completion_tokens)
        if not ({"reset", "stall", "midstream_error"} & ask.faults):
            return web.json_response(body)
        if "midstream_error" in ask.faults:  # the engine died while generating
            return self._error(ApiError(500, "The engine failed while generating"))
        payload = json.dumps(body).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(payload)
        await resp.prepare(request)
        await resp.write(payload[: len(payload) // 2])
        if "stall" in ask.faults:
            await asyncio.sleep(self.config.faults.stall_s)
        if "reset" in ask.faults and request.transport is not None:
            request.transport.abort()
            return resp
        await resp.write(payload[len(payload) // 2 :])
        await resp.write_eof()
        return resp

    def _prefill(self, ask: _Ask, entry: LoggedRequest) -> _Ask:
        """Look the prompt up in the prefix cache (and store it there): what was found is not
        computed, so it neither counts as prefill nor takes prefill time."""
        speed = ask.model.endpoints[0]
        use = NO_CACHE
        if self.prefix_cache is not None:
            ready = computed_by(self.clock, speed)
            use = self.prefix_cache.use(ask.prompt, self.clock.now(), ready)
        self.count_prefill(speed.tag, len(ask.prompt), use)
        entry.cached_tokens = use.cached
        ttft_s = entry.ttft_s = speed.ttft_s + prefill_s(speed, len(ask.prompt) - use.cached)
        return replace(ask, cached=use.cached, ttft_s=ttft_s)

    def _cache_report(self, ask: _Ask) -> dict[str, int] | None:
        """`prompt_tokens_details` as each server reports it, only with its switch on: current
        vLLM always (`--enable-prompt-tokens-details`), SGLang only when some were cached
        (`--enable-cache-report`)."""
        if not self.config.report_cached_tokens:
            return None
        if self.dialect == "sglang" and not ask.cached:
            return None
        return {"cached_tokens": ask.cached}

    def _usage(
        self, ask: _Ask, comp: Completion | list[Completion], completion_tokens: int
    ) -> dict[str, Any]:
        comps = comp if isinstance(comp, list) else [comp]
        reasoning_tokens = sum(c.reasoning_tokens for c in comps)
        usage: dict[str, Any] = {
            "prompt_tokens": len(ask.prompt),
            "total_tokens": len(ask.prompt) + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": self._cache_report(ask),
        }
        if self.dialect == "sglang":
            usage["reasoning_tokens"] = reasoning_tokens
        elif ask.model.reasoning:  # vLLM counts them with a reasoning parser
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return usage

    def _body(
        self, ask: _Ask, meta: dict[str, Any], comp: Completion, calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        reasoning = comp.reasoning if ask.include_reasoning and comp.reasoning else None
        finish = comp.finish_reason
        if self.dialect == "vllm":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": self._content(ask, comp) or None,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": calls,
                "reasoning": reasoning,
            }
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": comp.ids if ask.token_ids else None,
            }
            return {
                **meta,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": self._usage(ask, comp, comp.completion_tokens),
                "prompt_logprobs": None,
                "prompt_token_ids": ask.prompt if ask.token_ids else None,
                "kv_transfer_params": None,
            }
        message = {
            "role": "assistant",
            "content": self._content(ask, comp),
            "reasoning_content": reasoning,
            "tool_calls": calls or None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": comp.ids[-1] if finish != "length" and comp.ids else None,
        }
        if ask.prompt_ids:
            choice["prompt_token_ids"] = ask.prompt
        if ask.token_ids:
            choice["token_ids"] = comp.ids
        return {
            **meta,
            "choices": [choice],
            "usage": self._usage(ask, comp, comp.completion_tokens),
            "metadata": {"weight_version": "default"},
        }

    async def _stream(
        self,
        request: web.Request,
        ask: _Ask,
        meta: dict[str, Any],
        comp: Completion,
        calls: list[dict[str, Any]],
        entry: LoggedRequest,
    ) -> web.StreamResponse:
        """The completion as SSE, at the server's speed from the request's `since` (`Paced`),
        in each server's chunk shape.

        vLLM (fields it leaves unset are left out): a role chunk (with `prompt_token_ids`),
        content chunks each with its share of the completion's ids in `token_ids`, the finish
        reason on the last of them; usage only with `include_usage` (on every chunk with
        `continuous_usage_stats` as well). SGLang: a role chunk, content chunks whose delta
        always names `reasoning_content`, tool-call chunks with every null shown, a separate
        finish chunk with `matched_stop`; per-chunk usage with `continuous_usage_stats`
        alone. Both end with a choiceless usage chunk when asked, then `[DONE]`."""
        speed = ask.model.endpoints[0]
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        writer = Paced(resp, self.config.time_scale, entry)
        head = {**meta, "object": "chat.completion.chunk"}
        vllm = self.dialect == "vllm"
        deltas = self._deltas(ask, comp, calls)
        ids = comp.ids
        n = max(1, len(deltas))
        cuts = [len(ids) * i // n for i in range(n + 1)]
        matched = ids[-1] if comp.finish_reason != "length" and ids else None

        def usage_on(chunk: dict[str, Any], tokens: int, content: bool) -> dict[str, Any]:
            if ask.continuous_usage and (ask.include_usage if vllm else content):
                chunk["usage"] = self._usage(ask, comp, tokens)
            return chunk

        role: dict[str, Any] = {"role": "assistant", "content": ""}
        if not vllm:
            role = {"reasoning_content": None, **role}
        first = {
            **head,
            "choices": [{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}],
        }
        if vllm:
            first["prompt_token_ids"] = ask.prompt if ask.token_ids else None
        else:
            first["choices"][0]["matched_stop"] = None
        await writer.pace(ask.ttft_s)
        writer.send(usage_on(first, 0, False))
        per_chunk_s = 4 / speed.tokens_per_s
        for i, delta in enumerate(deltas or [{"content": ""}]):
            if i == len(deltas) // 2 and await self._fault(ask, request, writer):
                if "reset" not in ask.faults:
                    await resp.write_eof()
                return resp
            last = i == n - 1
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
            if vllm:
                choice["finish_reason"] = comp.finish_reason if last else None
                if last:
                    choice["stop_reason"] = None
                choice["token_ids"] = ids[cuts[i] : cuts[i + 1]] if ask.token_ids else None
            else:
                choice.update(finish_reason=None, matched_stop=None)
            writer.send(usage_on({**head, "choices": [choice]}, cuts[i + 1], True))
            await writer.pace(per_chunk_s)
        if not vllm:
            finish = {
                "index": 0,
                "delta": {"reasoning_content": None},
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else comp.finish_reason,
                "matched_stop": matched,
            }
            writer.send({**head, "choices": [finish]})
        if ask.include_usage:
            writer.send({**head, "choices": [], "usage": self._usage(ask, comp, len(ids))})
        writer.raw(b"data: [DONE]\n\n")
        await writer.finish()
        await resp.write_eof()
        return resp

    def _deltas(
        self, ask: _Ask, comp: Completion, calls: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The `delta` objects of a streamed answer: reasoning, content, then each call (its
        name first, then its arguments in pieces)."""
        vllm = self.dialect == "vllm"
        key = "reasoning" if vllm else "reasoning_content"
        out: list[dict[str, Any]] = []
        if ask.include_reasoning:
            out += [{key: p} for p in pieces(comp.reasoning, 4)]
        out += [{"content": p} if vllm else {"reasoning_content": None, "content": p}
                for p in pieces(self._content(ask, comp), 4)]  # fmt: skip
        for call in calls:
            fn, idx = call["function"], call["index"]
            args = fn["arguments"]
            parts = [args[i : i + 12] for i in range(0, len(args), 12)] or [""]
            for k, part in enumerate(parts):
                if vllm:
                    tc: dict[str, Any] = {"index": idx, "function": {"arguments": part}}
                    if k == 0:
                        tc = {"index": idx, "id": call["id"], "type": "function",
                              "function": {"name": fn["name"], "arguments": part}}  # fmt: skip
                    out.append({"tool_calls": [tc]})
                else:
                    tc = {
                        "id": call["id"] if k == 0 else None,
                        "index": idx,
                        "type": "function",
                        "function": {"name": fn["name"] if k == 0 else None, "arguments": part},
                    }
                    out.append(
                        {
                            "role": None,
                            "content": None,
                            "reasoning_content": None,
                            "tool_calls": [tc],
                        }  # fmt: skip
                    )
        return out

    def _content(self, ask: _Ask, comp: Completion) -> str:
        """The content as the server returns it: with `insert_without_thinking` before it when
        thinking is off (text the server adds that the ids do not hold)."""
        extra = self.config.insert_without_thinking if not ask.thinking and comp.content else ""
        return extra + comp.content

    async def _fault(self, ask: _Ask, request: web.Request, writer: Paced) -> bool:
        """A fault part-way through a stream: a stall (then go on), a cut connection or an
        error event (the stream ends: True)."""
        if "stall" in ask.faults:
            await writer.stall(self.config.faults.stall_s)
        if "reset" in ask.faults:
            await writer.flush()
            if request.transport is not None:
                request.transport.abort()
            return True
        if "midstream_error" in ask.faults:
            info = {
                "message": "The engine failed while generating",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
            writer.send({"error": info if self.dialect == "vllm" else {"object": "error", **info}})
            writer.raw(b"data: [DONE]\n\n")
            await writer.flush()
            return True
        return False


def _calls(comp: Completion, dialect: str, family: str) -> list[dict[str, Any]]:
    """The answer's calls as the server's tool parser returns them: Kimi-K2's and K2.5's
    parsers keep the model's `functions.NAME:IDX` ids; otherwise vLLM makes
    `chatcmpl-tool-...` ids and SGLang `call_...` ones."""
    out = []
    for call in comp.tool_calls:
        cid = call["id"]
        if family not in WRITES_CALL_IDS:
            suffix = cid.removeprefix("call_")
            cid = f"chatcmpl-tool-{suffix}" if dialect == "vllm" else f"call_{suffix}"
        out.append(
            {"id": cid, "type": "function", "index": call["index"], "function": call["function"]}
        )
    return out
