"""What every simulated family's parser shares: the simulator's tokenizer, the parsed shape of a
completion, and word-by-word encoding. grammar.py (Kimi-K2.5, Qwen3) and text_grammars.py (the
families parsed as text) both build on it, so neither imports the other.
"""

from __future__ import annotations

import json
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
