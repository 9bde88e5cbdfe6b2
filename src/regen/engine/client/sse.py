"""Server-sent events of a streamed chat completion, assembled into the body a non-streamed
request would have returned.

OpenRouter's stream has quirks that this handles: `: OPENROUTER PROCESSING` comment lines,
usage in a chunk after the finish chunk (with `choices: []` or one empty choice whose
`finish_reason` is null and must not overwrite the real one), tool-call arguments in pieces per
index, and a mid-stream error as a chunk with a top-level `error` and `finish_reason: "error"`.

A stream is read no further than its `limit` (errors.answer_bound): past it, it is
`oversized_answer`. Fields of the wrong type are skipped, as a missing field would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from regen.engine.client.errors import error_from_body, oversized
from regen.engine.client.response import loads_answer
from regen.errors import EndpointError


class StreamAssembler:
    """Feed it the bytes of a stream as they come; `body()` is the assembled completion."""

    __slots__ = (
        "_tail",
        "_content",
        "_token_ids",
        "_reasoning",
        "_calls",
        "_limit",
        "_request",
        "received",
        "finish_reason",
        "usage",
        "meta",
        "done",
        "chunks",
    )

    def __init__(self, limit: int | None = None, request: Mapping[str, Any] | None = None) -> None:
        self._tail: list[bytes] = []
        """The bytes after the last newline so far, in pieces (joined once a newline comes: a
        line sent in many pieces is not copied again for each)."""
        self._content: list[str] = []
        self._token_ids: list[Any] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._limit = limit
        self._request = request or {}
        """The request's body, for the oversized answer's message."""
        self.received = 0
        """Bytes fed so far."""
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.meta: dict[str, Any] = {}
        self.done = False
        self.chunks = 0

    def feed(self, data: bytes) -> None:
        """Take the next bytes; raises EndpointError on a mid-stream error, or when the stream
        passes its limit."""
        self.received += len(data)
        if self._limit is not None and self.received > self._limit:
            raise oversized(self._limit, self._request)
        if b"\n" not in data:
            if data:
                self._tail.append(data)
            return
        if self._tail:
            data = b"".join([*self._tail, data])
            self._tail.clear()
        lines = data.split(b"\n")
        last = lines.pop()
        if last:
            self._tail.append(last)
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
            # Comments (": OPENROUTER PROCESSING"), blank separators and other fields: skip.

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if not payload:
            return
        try:
            chunk = loads_answer(payload)
        except orjson.JSONDecodeError as exc:
            raise EndpointError("invalid_response", f"bad SSE chunk: {exc}", status=200) from exc
        if not isinstance(chunk, dict):
            raise EndpointError("invalid_response", "SSE chunk is not an object", status=200)
        self.chunks += 1
        if not self.meta:
            self.meta = {k: chunk.get(k) for k in ("id", "provider", "model")}
        if isinstance(chunk.get("prompt_token_ids"), list):
            # vLLM sends the prompt's ids in the first chunk only.
            self.meta["prompt_token_ids"] = chunk["prompt_token_ids"]
        if chunk.get("error") is not None:
            raise error_from_body(chunk["error"], status=200)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if choice.get("error") is not None:
            raise error_from_body(choice["error"], status=200)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._token_ids.extend(ids)
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and self.finish_reason is None:
            if finish == "error":
                raise EndpointError("server", "stream ended with finish_reason 'error'", status=200)
            self.finish_reason = finish

    def _delta(self, delta: dict[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._content.append(content)
        reasoning = delta.get("reasoning")
        if reasoning is None:
            reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self._reasoning.append(reasoning)
        calls = delta.get("tool_calls")
        for tc in calls if isinstance(calls, list) else ():
            if not isinstance(tc, dict):
                continue
            idx = tc.get("index")
            if idx is None:  # a server that sends one call at a time may leave it out
                idx = 0
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise EndpointError(
                    "invalid_response", f"tool call index is {type(idx).__name__}", status=200
                )
            call = self._calls.setdefault(idx, {"id": None, "name": None, "args": []})
            if isinstance(tc.get("id"), str) and tc["id"]:
                call["id"] = tc["id"]
            fn = tc.get("function")
            if isinstance(fn, dict):
                if isinstance(fn.get("name"), str) and fn["name"]:
                    call["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    call["args"].append(fn["arguments"])

    def body(self) -> dict[str, Any]:
        """The completion in the non-streamed shape; a stream cut short is a connection error."""
        last = b"".join(self._tail).strip()
        self._tail.clear()
        if last.startswith(b"data:"):
            self._event(last[5:].strip())
        if self.finish_reason is None and not self.done:
            raise EndpointError("connection", "stream ended before its finish chunk", status=200)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._content),
            "reasoning": "".join(self._reasoning) or None,
        }
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": c["id"] or "",
                    "type": "function",
                    "function": {"name": c["name"] or "", "arguments": "".join(c["args"])},
                }
                for _, c in sorted(self._calls.items())
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": self.finish_reason,
            "message": message,
        }
        if self._token_ids:
            choice["token_ids"] = self._token_ids
        return {**self.meta, "choices": [choice], "usage": self.usage}
