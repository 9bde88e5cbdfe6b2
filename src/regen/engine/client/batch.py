"""The samples of one prompt as one request: vLLM and SGLang take `n` and answer n choices
from one prefill of the prompt.

Each sample stays its own item to the scheduler (its own attempt, lease, bill and outcome):
`SampleBatcher.chat` is called once per sample, as any sender is. Calls whose bodies are the
same but for their seed (the prompt's samples, sent together since they are placed together
in the dispatch order) wait together for up to `window_s`, or until all the prompt's samples
are there, and go as one request with `n`; each caller gets its own choice, with its share of
the bill (response.choice_bodies). A request that fails fails every caller, each of which is
retried on its own (and may be batched again). Streams and prompts of one sample pass through.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from regen.conversation import Result, canonical_json
from regen.engine.client.body import SAMPLES_KEY, sent_settings
from regen.engine.client.http import ChatClient, Timeouts
from regen.errors import EndpointError

WINDOW_S = 0.02
"""How long the first sample of a prompt waits for the others (they are dispatched together)."""


@dataclass
class _Group:
    body: dict[str, Any]
    timeouts: Timeouts | None
    samples: int
    members: list[tuple[str, asyncio.Future[Result], Callable[[str], None] | None]] = field(
        default_factory=list
    )
    sent: bool = False
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None


class SampleBatcher:
    """A sender (the scheduler's Sender) that puts a prompt's samples in one request."""

    def __init__(self, client: ChatClient, window_s: float = WINDOW_S) -> None:
        self._client = client
        self._window_s = window_s
        self._open: dict[str, _Group] = {}
        self.requests = 0
        """Requests sent for batched samples (each of n choices)."""

    async def get_json(self, path: str) -> Any:
        return await self._client.get_json(path)

    async def probe(self, url: str) -> bool:
        return await self._client.probe(url)

    async def chat(
        self,
        item_id: str,
        body: dict[str, Any],
        *,
        stream: bool = False,
        timeouts: Timeouts | None = None,
        on_generation: Callable[[str], None] | None = None,
    ) -> Result:
        samples = body.get(SAMPLES_KEY)
        body = {k: v for k, v in body.items() if k != SAMPLES_KEY}
        if stream or not isinstance(samples, int) or samples <= 1:
            return await self._client.chat(
                item_id, body, stream=stream, timeouts=timeouts, on_generation=on_generation
            )
        key = canonical_json({k: v for k, v in body.items() if k != "seed"})
        group = self._open.get(key)
        loop = asyncio.get_running_loop()
        if group is None:
            group = self._open[key] = _Group(body, timeouts, samples)
            group.timer = loop.call_later(self._window_s, self._send, key, group)
        fut: asyncio.Future[Result] = loop.create_future()
        group.members.append((item_id, fut, on_generation))
        if len(group.members) >= group.samples:
            self._send(key, group)
        try:
            return await fut
        except asyncio.CancelledError:
            fut.cancel()
            if group.task is not None and all(f.done() for _, f, _ in group.members):
                group.task.cancel()  # nobody waits for it any more
            raise

    def _send(self, key: str, group: _Group) -> None:
        if group.sent:
            return
        group.sent = True
        if group.timer is not None:
            group.timer.cancel()
        if self._open.get(key) is group:
            del self._open[key]
        group.task = asyncio.get_running_loop().create_task(self._exchange(group))

    async def _exchange(self, group: _Group) -> None:
        members = [m for m in group.members if not m[1].done()]
        if not members:
            return
        ids = [m[0] for m in members]

        def named(generation_id: str) -> None:
            for _, _, callback in members:
                if callback is not None:
                    callback(generation_id)

        self.requests += 1
        try:
            if len(ids) == 1:
                outs: list[Result | EndpointError] = [
                    await self._client.chat(
                        ids[0], group.body, timeouts=group.timeouts, on_generation=named
                    )
                ]
            else:
                outs = await self._client.chat_choices(
                    ids, group.body, timeouts=group.timeouts, on_generation=named
                )
        except asyncio.CancelledError:
            for _, fut, _ in members:
                fut.cancel()
            raise
        except Exception as exc:  # the whole request failed: each sample fails with it
            for _, fut, _ in members:
                if not fut.done():
                    fut.set_exception(copy.copy(exc))
            return
        sent = {**group.body, "n": len(ids)} if len(ids) > 1 else group.body
        for k, ((_, fut, _), out) in enumerate(zip(members, outs, strict=True)):
            if fut.done():
                continue
            if isinstance(out, EndpointError):
                fut.set_exception(out)
            else:
                # What was sent for this sample: the one request's settings, and its choice.
                mark = {**sent, "choice": k} if len(ids) > 1 else sent
                fut.set_result(replace(out, settings=sent_settings(mark)))
