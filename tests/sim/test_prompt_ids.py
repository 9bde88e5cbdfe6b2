"""The simulator's prompt encoder (sim/tokens.py `PromptIds`): an earlier prompt's ids reused
where a new prompt extends it, always the ids the tokenizer gives the whole text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from regen.sim.chat import render_prompt
from regen.sim.grammar import FAMILIES, sim_tokenizer
from regen.sim.tokens import PromptIds

TOK = sim_tokenizer()
SPECIAL = [t.content for t in TOK.get_added_tokens_decoder().values()]
REAL = Path(__file__).resolve().parent.parent / "sources" / "fixtures" / "real"


def whole(text: str) -> list[int]:
    return list(TOK.encode(text, add_special_tokens=False).ids)


class Counted:
    """The sim tokenizer, counting the characters it is given to encode."""

    def __init__(self) -> None:
        self.chars = 0

    def get_added_tokens_decoder(self) -> Any:
        return TOK.get_added_tokens_decoder()

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        self.chars += len(text)
        return TOK.encode(text, add_special_tokens=add_special_tokens)


# Pieces that stress the cut: added tokens, their halves (completed by what follows), runs of
# whitespace (the pre-tokenizer looks ahead at them), words and characters of several bytes.
PIECES = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(SPECIAL).map(lambda s: s[: len(s) // 2]),
    st.sampled_from(SPECIAL).map(lambda s: s[len(s) // 2 :]),
    st.sampled_from([" ", "  ", "\n", "\n\n", " \n", "\t"]),
    st.text(alphabet="ab xyé字🙂<|>_\n", min_size=1, max_size=12),
)
TEXTS = st.lists(PIECES, max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(TEXTS, st.lists(TEXTS, min_size=1, max_size=4), st.integers(0, 400))
def test_a_prompt_that_extends_an_earlier_one_has_the_ids_of_the_whole_text(
    first: str, more: list[str], chars: int
) -> None:
    # `chars`: the characters it may keep, small enough here to drop prompts it has seen
    # (or never keep one) and have them encoded again.
    encode = PromptIds(TOK, keep=3, chars=chars)
    text = first
    assert encode(text) == whole(text)
    for extra in more:
        text += extra
        assert encode(text) == whole(text)
        assert encode(text) == whole(text)  # the same prompt again (an escalation, a retry)
        assert encode.held[1] <= chars
    assert encode(first) == whole(first)  # an earlier one, kept or not


def test_what_it_keeps_is_bounded_by_characters_as_well_as_by_count() -> None:
    # The simulator takes request bodies of up to 64 MB: 64 prompts of that size kept would
    # hold gigabytes. Prompts are dropped oldest first while they are over the bound, and one
    # longer than the bound is encoded whole and not kept.
    encode = PromptIds(TOK, keep=64, chars=1000)
    texts = [f"<|im_start|>user {k} " + "word " * 50 for k in range(40)]
    for text in texts:
        assert encode(text) == whole(text)
    count, chars = encode.held
    assert chars <= 1000
    assert count == 1000 // len(texts[-1])  # the most recent that fit, not 40
    big = texts[0] + "more " * 300
    assert encode(big) == whole(big)
    assert encode.held == (count, chars)  # not kept, and nothing dropped for it


def trajectory() -> list[dict[str, Any]]:
    """The real SWE-agent trajectory of tests/sources/fixtures/real as chat messages (its
    content parts joined; tool observations as user turns). bench/sim_cpu.py sends it too."""
    (row,) = [
        json.loads(line)
        for line in (REAL / "swe_agent_traj.jsonl").read_text().splitlines()
        if line
    ]
    history = []
    for m in row["history"]:
        content = m["content"]
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content)
        history.append(
            {"role": "assistant" if m["role"] == "assistant" else "user", "content": content}
        )
    return history


def test_an_agent_trajectorys_turns_each_have_the_ids_of_their_whole_prompt() -> None:
    # A real SWE-agent trajectory, each turn's prompt being the history so far, rendered by
    # every simulated family's template: the turns' prompts mostly extend the one before,
    # where most of the ids are reused.
    history = trajectory()
    rendered = 0
    counted = Counted()
    for family in FAMILIES:
        encode = PromptIds(cast(Any, counted))
        for k in range(1, len(history) + 1, 3):
            turn = history[:k]
            if turn[-1]["role"] == "assistant":
                continue
            text = render_prompt(family, turn, [], False)
            rendered += len(text)
            assert encode(text) == whole(text), (family, k)
    assert counted.chars < 0.3 * rendered  # the turns before were not encoded again
