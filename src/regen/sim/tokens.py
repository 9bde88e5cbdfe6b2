"""What every simulated family's parser shares: the simulator's tokenizer, the parsed shape of a
completion, and word-by-word encoding. grammar.py (Kimi-K2.5, Qwen3) and text_grammars.py (the
families parsed as text) both build on it, so neither imports the other.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol

from tokenizers import Tokenizer

from regen.sim.words import WORDS


@cache
def sim_tokenizer() -> Tokenizer:
    """The small tokenizer shipped with the simulator (built by scripts/build_sim_tokenizer.py)."""
    path = resources.files("regen.sim").joinpath("tokenizer", "tokenizer.json")
    return Tokenizer.from_str(path.read_text(encoding="utf-8"))


class PromptIds:
    """Prompt token ids by the sim tokenizer, an earlier prompt's reused where a new one
    shares its start: a conversation's next turn (an agent trajectory's prompt is the last
    one's history and more), an escalated item's or a retry's same prompt. Encoding a
    30,000-token agent history took the simulator 50 ms of its one core, so at a lane of 64
    its answers came as fast as it could tokenize, not at the provider's pace: time the
    simulated provider does not spend.

    Exact, not approximate: every added token of the sim tokenizer is special and matched
    verbatim (no normalizing, no stripping), so a text is cut into pieces at their occurrences
    before anything else, and each piece is encoded on its own. Cut where one starts, the ids
    of the text are those of the part before plus those of the rest. The cut is at the last
    such start in the part the two prompts share with room behind it, within that part, for
    the longest added token (so the new prompt cannot match a longer one there)."""

    def __init__(self, tok: Tokenizer, keep: int = 64, chars: int = 32_000_000) -> None:
        """Keeps the last `keep` prompts and at most `chars` characters of them (the
        simulator takes bodies of up to 64 MB: 64 of those kept would be gigabytes); a prompt
        longer than `chars` is encoded whole and not kept."""
        self._tok = tok
        self._keep = keep
        self._chars = chars
        self._held = 0
        added = tok.get_added_tokens_decoder()
        self._special = frozenset(added)
        self._longest = max((len(t.content) for t in added.values()), default=0)
        self._recent: OrderedDict[str, tuple[array[int], list[tuple[int, int]]]] = OrderedDict()
        """Recent prompts: their ids (4 bytes each, not a Python int's 36: 64 agent histories
        of 30,000 tokens are 8 MB), and where each added token starts (char, token index)."""
        self._lock = threading.Lock()  # simulators in threads of one process share it

    def __call__(self, text: str) -> list[int]:
        with self._lock:
            hit = self._recent.get(text)
            if hit is not None:
                self._recent.move_to_end(text)
                return list(hit[0])
            # The earlier prompt this one shares the most with (a next turn's history ends
            # where the turn before asked for its answer, and goes on with that answer).
            shared, earlier = max(
                ((_shared(text, p), p) for p in self._recent if p[:64] == text[:64]),
                default=(0, ""),
            )
            ids, marks = self._recent.get(earlier, (array("I"), []))
        # The last mark with room for the longest added token in the shared part; the marks
        # before it (they are in order) stay as they were.
        cut, head, kept = 0, 0, 0
        for k in range(len(marks) - 1, -1, -1):
            at, index = marks[k]
            if at + self._longest <= shared:
                cut, head, kept = at, index, k
                break
        enc = self._tok.encode(text[cut:], add_special_tokens=False)
        out = ids[:head]
        out.extend(enc.ids)
        starts = marks[:kept] + [
            (cut + start, head + i)
            for i, (tid, (start, _)) in enumerate(zip(enc.ids, enc.offsets, strict=True))
            if tid in self._special
        ]
        if len(text) > self._chars:
            return list(out)
        with self._lock:
            if text not in self._recent:  # another thread may have kept it meanwhile
                self._held += len(text)
            self._recent[text] = (out, starts)
            while len(self._recent) > self._keep or self._held > self._chars:
                gone, _ = self._recent.popitem(last=False)
                self._held -= len(gone)
        return list(out)

    @property
    def held(self) -> tuple[int, int]:
        """How many prompts it keeps and their characters."""
        with self._lock:
            return len(self._recent), self._held


def _shared(a: str, b: str) -> int:
    """How many characters two texts share at their start: slices compared at C speed, twice
    as long each time until they differ, then a binary search (work in proportion to what
    they share, not to their lengths)."""
    most = min(len(a), len(b))
    low, high = 0, 64
    while high < most and a[:high] == b[:high]:
        low, high = high, 2 * high
    high = min(high, most)
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@cache
def encode_prompt() -> PromptIds:
    """The simulator's prompt encoder (`PromptIds` over `sim_tokenizer`)."""
    return PromptIds(sim_tokenizer())


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call as the model wrote it: name and the argument text, verbatim."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the server makes of completion ids."""

    reasoning: str
    content: str
    calls: list[Call]
    reasoning_tokens: int
    complete: bool
    """False when the ids stop before the end-of-turn token (cut at max_tokens)."""


class Grammar(Protocol):
    name: str
    tok: Tokenizer

    def parse(self, ids: list[int], thinking: bool, tools: list[Any] | None = None) -> Parsed:
        """`tools`: the request's declared tools (the XML call formats read their schemas)."""
        ...


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else json.dumps(v, ensure_ascii=False))


def special_id(tok: Tokenizer, token: str) -> int:
    tid = tok.token_to_id(token)
    if tid is None:
        raise ValueError(f"the sim tokenizer has no {token} token")
    return int(tid)


@cache
def _word_ids() -> tuple[dict[str, int], dict[str, int]]:
    """Ids of each sim word at the start of a text and after a space (one token each)."""
    tok = sim_tokenizer()
    first = {w: tok.encode(w, add_special_tokens=False).ids for w in WORDS}
    spaced = {w: tok.encode(" " + w, add_special_tokens=False).ids for w in WORDS}
    return (
        {w: i[0] for w, i in first.items() if len(i) == 1},
        {w: i[0] for w, i in spaced.items() if len(i) == 1},
    )


def encode_words(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of text. Text made of sim words joined by single spaces maps word by word
    (the same ids the tokenizer gives, far cheaper); anything else goes to the tokenizer."""
    if not text:
        return []
    first, spaced = _word_ids()
    words = text.split(" ")
    head = first.get(words[0])
    if head is not None:
        try:
            return [head, *(spaced[w] for w in words[1:])]
        except KeyError:
            pass
    return list(tok.encode(text, add_special_tokens=False).ids)
