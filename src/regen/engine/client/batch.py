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
from regen.engine.client.response import N_IGNORED
from regen.errors import EndpointError

WINDOW_S = 0.02
"""How long the first sample of a prompt waits for the others (they are dispatched together)."""


_Member = tuple[str, asyncio.Future[Result], Callable[[str], None] | None, dict[str, Any]]
"""A sample waiting in a group: its item, its future, its generation callback, its own body."""


@dataclass
class _Group:
    body: dict[str, Any]
    timeouts: Timeouts | None
    samples: int
    members: list[_Member] = field(default_factory=list)
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
        self.one_by_one = False
        """The server answered one choice for `n`: each sample goes alone from then on."""

    @property
    def learned(self) -> list[str]:
        """What was learned of the server and not yet said (the client's list)."""
        return self._client.learned

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
        if stream or self.one_by_one or not isinstance(samples, int) or samples <= 1:
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
        group.members.append((item_id, fut, on_generation, body))
        if len(group.members) >= group.samples:
            self._send(key, group)
        try:
            return await fut
        except asyncio.CancelledError:
            fut.cancel()
            if group.task is not None and all(m[1].done() for m in group.members):
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
            for _, _, callback, _ in members:
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
            for m in members:
                m[1].cancel()
            raise
        except Exception as exc:  # the whole request failed: each sample fails with it
            for m in members:
                fut = m[1]
                if not fut.done():
                    fut.set_exception(copy.copy(exc))
            return
        if len(ids) > 1 and _ignored_n(outs):
            outs = [outs[0], *await self._alone(members[1:], group.timeouts)]
        sent = {**group.body, "n": len(ids)} if len(ids) > 1 else group.body
        for k, ((_, fut, _, _), out) in enumerate(zip(members, outs, strict=True)):
            if fut.done():
                continue
            if isinstance(out, EndpointError):
                fut.set_exception(out)
            else:
                # What was sent for this sample: the one request's settings, and its choice.
                mark = {**sent, "choice": k} if len(ids) > 1 else sent
                fut.set_result(replace(out, settings=sent_settings(mark)))

    async def _alone(
        self, members: list[_Member], timeouts: Timeouts | None
    ) -> list[Result | EndpointError]:
        """The server ignored `n`: learned and said once; these samples (which it never
        generated) are sent now, each alone with its own body, and so is every sample after."""
        if not self.one_by_one:
            self.one_by_one = True
            self._client.learned.append(
                f"the server at {self._client.base_url} ignores n (asked for several choices, "
                "it answered one): each sample goes as its own request from now on (set "
                "[endpoint] samples_in_one_request = false to say so in the job)"
            )

        async def one(m: _Member) -> Result | EndpointError:
            try:
                return await self._client.chat(m[0], m[3], timeouts=timeouts, on_generation=m[2])
            except EndpointError as exc:
                return exc

        return list(await asyncio.gather(*(one(m) for m in members)))


def _ignored_n(outs: list[Result | EndpointError]) -> bool:
    """Whether an answer for n choices was one choice (the first answered, no other)."""
    return isinstance(outs[0], Result) and all(
        isinstance(o, EndpointError) and o.message == N_IGNORED for o in outs[1:]
    )
