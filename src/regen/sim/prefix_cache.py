"""A prefix cache of prompt tokens, as inference servers keep one: the prompt cut into blocks of
`block_tokens`, each block named by a hash of everything up to its end, so a block is found
only after the same whole prefix. Blocks live `ttl_s` after their last use (None: until
evicted) and the least recently used go first when the cache holds more than its capacity.
A block is readable only once the request that wrote it has computed its prompt (its time to
first token): a request that comes while the same prefix is still being computed computes it
again and pays for it again, as a provider's cache entry exists only after the first response
begins (Anthropic's and OpenAI's prompt-caching guides say so; vLLM shares a block once its
KV is computed).

One mechanism for every simulated server: an OpenRouter provider endpoint (server.py) and a
self-hosted vLLM or SGLang server (selfhosted.py) each own one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


class SimClock:
    """Simulated seconds: the wall clock divided by the sim's time_scale, standing still at
    time_scale 0; `advance` moves it on (a test's hook to let a cache or a sticky route
    expire without waiting)."""

    def __init__(self, time_scale: float) -> None:
        self._scale = time_scale
        self._start = time.monotonic()
        self._skew = 0.0

    def now(self) -> float:
        elapsed = time.monotonic() - self._start
        return self._skew + (elapsed / self._scale if self._scale > 0 else 0.0)

    def advance(self, seconds: float) -> None:
        self._skew += seconds

    def after(self, seconds: float) -> float:
        """The simulated time `seconds` from now; now at time_scale 0, where the clock stands
        still and work takes no time."""
        return self.now() + (seconds if self._scale > 0 else 0.0)


@dataclass(frozen=True, slots=True)
class CacheUse:
    """What one prompt found in a cache and added to it."""

    cached: int
    """Leading prompt tokens read from the cache (not computed)."""
    written: int
    """Prompt tokens newly stored (whole blocks that were not there)."""


NO_CACHE = CacheUse(cached=0, written=0)


class PrefixCache:
    """Block-hashed prompt prefixes with a lifetime and LRU eviction."""

    def __init__(self, block_tokens: int, capacity_tokens: int, ttl_s: float | None) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = max(1, capacity_tokens // block_tokens)
        self.ttl_s = ttl_s
        self._blocks: OrderedDict[int, tuple[float, float]] = OrderedDict()
        """Block hash -> (when it was last used, when it is readable), sim seconds; oldest
        use first."""

    def _hashes(self, ids: list[int]) -> list[int]:
        # Python's hash of a tuple of ints is not salted per process, and fast enough for
        # SGLang's one-token pages; a 64-bit collision is not a concern for a simulator.
        out: list[int] = []
        prev = 0
        n = self.block_tokens
        for start in range(0, len(ids) - n + 1, n):
            prev = hash((prev, *ids[start : start + n]))
            out.append(prev)
        return out

    def _stored(self, h: int, now: float) -> tuple[float, float] | None:
        """The block's (last use, readable from), None if it is not held or has expired."""
        entry = self._blocks.get(h)
        if entry is None:
            return None
        if self.ttl_s is not None and now - entry[0] > self.ttl_s:
            del self._blocks[h]
            return None
        return entry

    def _expired_first(self, now: float) -> bool:
        """Whether the least recently used block has outlived its lifetime (blocks are kept in
        the order of their last use, so expired ones are dropped from the front, not left to
        fill the capacity)."""
        if self.ttl_s is None or not self._blocks:
            return False
        oldest = next(iter(self._blocks.values()))[0]
        return now - oldest > self.ttl_s

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def use(
        self, ids: list[int], now: float, ready: Callable[[int], float] | None = None
    ) -> CacheUse:
        """Read the longest readable cached prefix of `ids` (whole blocks, never the last
        token: a server computes at least one), then store the prompt's blocks, all marked used
        now. `ready(computed)` is when this request's blocks become readable, given how many
        tokens it computes (None: at once); a block another request is still computing stays
        theirs, readable when the first of them is done."""
        hashes = self._hashes(ids)
        hit = 0
        while hit < len(hashes):
            entry = self._stored(hashes[hit], now)
            if entry is None or entry[1] > now:
                break
            hit += 1
        n = self.block_tokens
        cached = max(0, min(hit * n, (len(ids) - 1) // n * n))
        done = ready(len(ids) - cached) if ready is not None else now
        for h in hashes:
            entry = self._stored(h, now)
            self._blocks[h] = (now, done if entry is None else min(entry[1], done))
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks or self._expired_first(now):
            self._blocks.popitem(last=False)
        return CacheUse(cached=cached, written=(len(hashes) - hit) * self.block_tokens)
