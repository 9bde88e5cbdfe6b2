"""How a simulated answer goes on the wire: a JSON body (with padding, a mid-body reset or a
stall when a fault says so), or an SSE stream in OpenRouter's chunk shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from regen.sim.config import SimConfig, SimEndpoint
from regen.sim.generate import Completion
from regen.sim.stream import chunk, deltas

if TYPE_CHECKING:
    from regen.sim.server import LoggedRequest

PADDING_LINE = b"\n         \n"
PADDING = PADDING_LINE * 8
"""What the `padding` and `error_200` faults lead a JSON body with."""
PADDING_EVERY_S = 10.0
"""How often (simulated seconds) a non-streamed answer being generated sends a padding line."""
KEEPALIVE = b": OPENROUTER PROCESSING\n\n"


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    body = {"error": {"code": status, "message": message, **extra}, "user_id": None}
    return web.json_response(body, status=status, headers=headers)


def abort(request: web.Request) -> None:
    """Cut the connection mid-body, as a crashed proxy would."""
    if request.transport is not None:
        request.transport.abort()


def message_of(comp: Completion, shown: bool) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": comp.content,
        "refusal": None,
        "reasoning": comp.reasoning if shown and comp.reasoning else None,
    }
    if message["reasoning"]:
        message["reasoning_details"] = [
            {"type": "reasoning.text", "text": comp.reasoning, "format": "unknown", "index": 0}
        ]
    if comp.tool_calls:
        message["tool_calls"] = comp.tool_calls
    return message


async def respond_json(
    config: SimConfig,
    request: web.Request,
    meta: dict[str, Any],
    comp: Completion,
    usage: dict[str, Any],
    faults: set[str],
    shown: bool,
    generating_s: float,
    entry: LoggedRequest,
    done: Callable[[], None] = lambda: None,
) -> web.StreamResponse:
    """A non-streamed answer as OpenRouter sends one: HTTP 200 and its headers (with
    `X-Generation-Id`) as soon as the request is routed, whitespace padding lines then and
    about every 10 simulated seconds while the answer is generated (`generating_s` from the
    request's `since`, and how late it ended in its `late_s`: `Paced`), then the JSON body. An
    error found later (`error_200`) can only come as a 200 with an `error` body. When nothing
    is left to wait for (time_scale 0), the headers and body go out in one write, as they
    would arrive; the padding fault still leads the body with padding. `done()` is called
    when the whole answer is about to go out (not when it is cut), so that it is billed
    before the client can see its end."""
    finish = comp.finish_reason if comp.completion_tokens else None
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": finish,
        "native_finish_reason": finish,
        "message": message_of(comp, shown),
    }
    if "midstream_error" in faults:
        partial = comp.content[: len(comp.content) // 2]
        choice.update(
            finish_reason="error",
            native_finish_reason="error",
            error={
                "code": 502,
                "message": "Provider disconnected mid-generation",
                "metadata": {"provider_name": meta["provider"]},
            },
        )
        choice["message"] = {"role": "assistant", "content": partial}
    doc: dict[str, Any] = {
        **meta,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage,
    }
    if "error_200" in faults:
        doc = {
            "error": {
                "code": 502,
                "message": "Provider returned error",
                "metadata": {
                    "provider_name": meta["provider"],
                    "raw": "upstream connection closed",
                },
            },
            "user_id": None,
        }
    payload = json.dumps(doc).encode()
    lead = PADDING if "padding" in faults or "error_200" in faults else b""
    resp = web.StreamResponse(
        headers={"Content-Type": "application/json", "X-Generation-Id": meta["id"]}
    )
    wait_s = generating_s * config.time_scale
    cut = {"reset", "stall"} & faults
    if wait_s > 0 or cut:
        # What comes is not known yet: no Content-Length, the body is chunked.
        await resp.prepare(request)
        if wait_s > 0:
            await resp.write(lead or PADDING_LINE)  # the status and headers go out with it
            every_s = PADDING_EVERY_S * config.time_scale
            entry.late_s = await _pad(resp, entry.since, wait_s, every_s)
        elif lead:
            await resp.write(lead)
        lead = b""
    if not cut:
        if not resp.prepared:
            resp.content_length = len(lead) + len(payload)
            await resp.prepare(request)
        done()
        await resp.write_eof(lead + payload)
        return resp
    half = len(payload) // 2
    await resp.write(payload[:half])
    if "stall" in faults:
        await asyncio.sleep(config.faults.stall_s)
    if "reset" in faults:
        abort(request)
        return resp
    done()
    await resp.write(payload[half:])
    await resp.write_eof()
    return resp


async def _pad(resp: web.StreamResponse, start: float, wait_s: float, every_s: float) -> float:
    """Wait until `wait_s` after `start` (loop time), writing a padding line every `every_s`
    (on a fixed clock: the lines do not drift later with the loop's delays); how late it
    ended."""
    loop = asyncio.get_running_loop()
    end = start + wait_s
    ticks = 1
    while start + ticks * every_s < end:
        await asyncio.sleep(max(0.0, start + ticks * every_s - loop.time()))
        await resp.write(PADDING_LINE)
        ticks += 1
    await asyncio.sleep(max(0.0, end - loop.time()))
    return max(0.0, loop.time() - end)


class Paced:
    """An answer's bytes written on its own clock: each piece of it is due a simulated time
    after the request's `since` (the loop time it arrived, later by any wait the simulator
    means, a hold or a queue for a slot), scaled by the time scale, and goes out when due.

    The clock is the answer's, not the simulator's: what the simulator spends of its one
    core (rendering and tokenizing a prompt, other answers' chunks) does not make an answer
    later, as no provider's answer waits on a client's simulator. An answer held up past its
    due time catches up (its chunks go out as they are made, the loop given its turn between
    them) rather than carrying the delay to its end. Pieces within 10 ms of each other go out
    in one write: the timing stays faithful at that grain and the CPU goes to requests, not
    syscalls."""

    def __init__(self, resp: web.StreamResponse, time_scale: float, entry: LoggedRequest) -> None:
        self._resp, self._scale, self._entry = resp, time_scale, entry
        self._loop = asyncio.get_running_loop()
        self._due = self._written = entry.since
        self.buf: list[bytes] = []

    def send(self, obj: dict[str, Any]) -> None:
        self.buf.append(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def raw(self, line: bytes) -> None:
        self.buf.append(line)

    async def flush(self) -> None:
        if self.buf:
            await self._resp.write(b"".join(self.buf))
            self.buf.clear()

    async def pace(self, seconds: float) -> None:
        """What was sent so far took `seconds` (simulated) to make."""
        self._due += seconds * self._scale
        if self._due - self._written >= 0.01:
            await self.flush()
            self._written = self._due
            await asyncio.sleep(max(0.0, self._due - self._loop.time()))

    async def finish(self) -> None:
        """Wait until all that was paced is due (the pieces short of a write's 10 ms too),
        then send what is left; how late that is goes in the request's `late_s` (the
        simulator's own time, when its work outran the answers')."""
        await asyncio.sleep(max(0.0, self._due - self._loop.time()))
        self._written = self._due
        self._entry.late_s = max(0.0, self._loop.time() - self._due)
        await self.flush()

    async def stall(self, seconds: float) -> None:
        """A stall (a fault): nothing for `seconds` of real time, however late the answer
        is, and what follows that much later."""
        await self.flush()
        await asyncio.sleep(seconds)
        self._due = self._written = max(self._due + seconds, self._loop.time())


async def respond_stream(
    config: SimConfig,
    request: web.Request,
    meta: dict[str, Any],
    comp: Completion,
    usage: dict[str, Any],
    faults: set[str],
    endpoint: SimEndpoint,
    shown: bool,
    entry: LoggedRequest,
    done: Callable[[], None] = lambda: None,
    ttft_s: float | None = None,
) -> web.StreamResponse:
    """Stream the completion at the endpoint's speed, its first token `ttft_s` (the
    endpoint's own by default) after the request's `since` (`Paced`); `done()` is called
    before the last bytes of a whole stream go out."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Generation-Id": meta["id"],
        }
    )
    await resp.prepare(request)
    keepalive = "keepalive" in faults
    out = Paced(resp, config.time_scale, entry)

    # Every content chunk shares its envelope: serialize it once.
    head = (
        json.dumps(meta)[:-1] + ', "object": "chat.completion.chunk", "choices": '
        '[{"index": 0, "delta": '
    ).encode()
    tail = b', "finish_reason": null, "native_finish_reason": null, "logprobs": null}]}\n\n'

    if keepalive:
        out.raw(KEEPALIVE)
    await out.flush()
    await out.pace(endpoint.ttft_s if ttft_s is None else ttft_s)
    k = config.stream_chunk_tokens
    parts = deltas(comp, k, shown)
    cut = len(parts) // 2
    per_chunk_s = k / endpoint.tokens_per_s
    for i, delta in enumerate(parts):
        if i == cut:
            if "stall" in faults:
                await out.stall(config.faults.stall_s)
            if "reset" in faults:
                await out.flush()
                abort(request)
                return resp
            if "midstream_error" in faults:
                out.send(
                    {
                        **meta,
                        "object": "chat.completion.chunk",
                        "error": {
                            "code": 502 if i % 2 else "server_error",
                            "message": "Provider disconnected mid-generation",
                            "metadata": {"error_type": "provider_error"},
                        },
                        "choices": [
                            {"index": 0, "delta": {"content": ""}, "finish_reason": "error"}
                        ],
                    }
                )
                await out.flush()
                await resp.write_eof()
                return resp
        if keepalive and i and i % 16 == 0:
            out.raw(KEEPALIVE)
        out.raw(b"data: " + head + json.dumps(delta).encode() + tail)
        await out.pace(per_chunk_s)
    finish = comp.finish_reason if comp.completion_tokens else None
    out.send(chunk(meta, {"role": "assistant", "content": ""}, finish))
    style = config.faults.usage_chunk
    if style == "random":
        style = "empty_choices" if int(meta["id"][-1], 36) % 2 else "empty_choice"
    usage_chunk: dict[str, Any] = {**meta, "object": "chat.completion.chunk", "usage": usage}
    usage_chunk["choices"] = (
        []
        if style == "empty_choices"
        else [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "native_finish_reason": None,
                "logprobs": None,
            }
        ]
    )
    out.send(usage_chunk)
    out.raw(b"data: [DONE]\n\n")
    done()
    await out.finish()
    await resp.write_eof()
    return resp
