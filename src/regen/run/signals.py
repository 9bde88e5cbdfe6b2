"""SIGINT and SIGTERM for the whole life of `regen run`, so that Python's default handlers
never end it half-way (a lock left behind, no summary, answers paid for and lost). The rule:

- Before the first request (the lock, the datasets read): the first signal stops the run at
  once (`Interrupted`, exit 130): nothing is in flight, and what was read is committed.
- While sending: the first signal stops dispatch; requests in flight finish within
  `[run] stop_grace_s` and are committed. A SIGTERM never does more: another one is ignored
  (one line says so), so a burst of them from a process manager ends the run as the first one
  does. A SIGINT (Ctrl-C) once a stop is under way cuts the requests in flight short (exit
  130): their items stay pending, and what they cost is looked up by the next run.
- At the end (exports, report, summary), signals are ignored: that takes seconds, and an end
  cut short would leave no summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Literal

from regen.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class _Binding:
    """What a signal does while dispatch runs on `loop` (called there, never inside the
    handler, which may interrupt any line of the loop's own code)."""

    loop: asyncio.AbstractEventLoop
    stop: Callable[[str], None]
    """The first signal, by name: stop sending, and say so."""
    cut: Callable[[], None]
    """A SIGINT during the stop: cut the requests in flight short, and say so."""
    say: Callable[[str], None]


class StopSignals:
    """The run's signal handling (see the module's rule). Made and installed by
    `stop_signals()`; dispatch binds its actions with `sending()`."""

    def __init__(self) -> None:
        self.phase: Literal["before", "sending", "ending"] = "before"
        self.first: str | None = None
        """The name of the first signal (None: none came)."""
        self.cut = False
        self._bindings: list[_Binding] = []
        self._told = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.phase == "before" and self.first is None:
            self.first = name
            raise Interrupted(name)
        if self._bindings:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._bindings[-1].loop.call_soon_threadsafe(self._while_sending, name)
                return
        # Outside the loop a print could land inside another one (a reentrant write fails):
        # a single write to the descriptor cannot.
        if not self._told:
            self._told = True
            with contextlib.suppress(OSError):
                os.write(2, (self._ignored(name) + "\n").encode())

    def _while_sending(self, name: str) -> None:
        if not self._bindings:
            return
        binding = self._bindings[-1]
        if self.first is None:
            self.first = name
            binding.stop(name)
        elif name == "SIGINT" and not self.cut:
            self.cut = True
            binding.cut()
        elif not self._told:
            self._told = True
            binding.say(self._ignored(name))

    def _ignored(self, name: str) -> str:
        if self.phase == "ending":
            return f"{name} ignored: the run is writing its exports, report and summary"
        if self.cut:
            return f"{name} ignored: the requests in flight were cut short already"
        if self.phase == "sending":
            return (
                f"{name} ignored: the run is stopping already, and requests in flight finish "
                "and are kept (a SIGTERM never cuts them short; Ctrl-C does)"
            )
        return f"{name} ignored: the run is stopping already"

    @contextlib.contextmanager
    def sending(
        self, *, stop: Callable[[str], None], cut: Callable[[], None], say: Callable[[str], None]
    ) -> Iterator[None]:
        """While dispatch runs on this thread's event loop, the first signal calls `stop` and a
        SIGINT after it `cut`; an inner binding stands in for an outer one until it ends. A
        signal that came before is in `first`: the caller acts on it."""
        self.phase = "sending"
        self._bindings.append(_Binding(asyncio.get_running_loop(), stop, cut, say))
        try:
            yield
        finally:
            self._bindings.pop()

    def ending(self) -> None:
        """Sending is over: from now on signals are ignored."""
        self.phase = "ending"


_active: StopSignals | None = None


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """The process's SIGINT and SIGTERM handling for a block: installed on entry, the earlier
    handlers put back at its end; a nested block shares the outer one. Off the main thread
    (a test that runs regen beside a server) signals are not the thread's to take: nothing
    is installed, and the handling never fires."""
    global _active
    if _active is not None:
        yield _active
        return
    signals = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    saved = {s: signal.signal(s, signals._handle) for s in SIGNALS}
    _active = signals
    try:
        yield signals
    finally:
        _active = None
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
