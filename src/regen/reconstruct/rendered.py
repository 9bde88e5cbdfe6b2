"""A completion from the model's own chat template: what the template writes for the history
plus the finished answer, after what it writes for the history with the generation prompt.

The few things a template does not show are the family's rules (families.toml), never code
here: the end token it does not write, and where several end tokens exist, which one ends the
turn. An answer the template cannot show (its render of the finished answer does not extend
the prompt, or has no end token) is an error naming what to set, never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regen.reconstruct.families import Answer, Family


class ReconstructError(Exception):
    """One answer's ids cannot be built (its prompt does not render, or the template cannot
    show its answer)."""


def trimmed(field: str) -> list[str]:
    """The forms of a stored reasoning or content the template may have been given, the most
    whitespace taken off first. A server's parser hands a field back with the separators the
    template writes around it (vLLM: `\\n\\nC` after `</think>`, `C\\n` before a call), and
    the model's own whitespace (a code block's closing newline) looks the same: which is which
    only the render can tell (`fitted`). A blank field is none."""
    core = field.strip()
    if not core:
        return [""]
    lead = field[: len(field) - len(field.lstrip())]
    trail = field[len(field.rstrip()) :]
    kept = [(i, j) for i in _counts(len(lead)) for j in _counts(len(trail))]
    kept.sort(key=lambda ij: ij[0] + ij[1])
    return [lead[len(lead) - i :] + core + trail[:j] for i, j in kept]


def _counts(n: int) -> list[int]:
    """How much of a run of n whitespace characters to keep: all, or up to 8 (a longer run is
    the model's, not a template's separator)."""
    return sorted({*range(min(n, 8) + 1), n})


def fitted(field: str, shows: Callable[[str], bool]) -> str:
    """The form of a stored field to give the template: the one with the most whitespace
    taken off whose render still shows the stored field whole (`shows`), so that separators
    are what the template writes around the text and never come off the model's text. None
    shows it (a template that trims what the model wrote, a provider that stripped it): the
    bare text, and the self-check says what is lost."""
    forms = trimmed(field)
    return next((f for f in forms if shows(f)), forms[0])


def fitted_fields(
    a: Answer, prefill: str, completion: Callable[[str, str], str]
) -> tuple[str, str]:
    """(reasoning, content) to give the template, each `fitted` so that the completion
    (`completion(reasoning, content)`) holds the stored field whole. A server's parser reads
    the generated text only; a field that begins in what the prompt pre-filled (a provider
    that adds it back) is looked for with that pre-fill."""

    def shows(stored: str, lead: str, fields: tuple[str, str]) -> bool:
        try:
            return stored in lead + completion(*fields)
        except ReconstructError:  # this form does not render: the last one says why
            return False

    def fit(stored: str, form: Callable[[str], tuple[str, str]]) -> str:
        for lead in ("", prefill):
            found = fitted(stored, lambda f: shows(stored, lead, form(f)))  # noqa: B023 - used in this turn only
            if shows(stored, lead, form(found)):
                return found
        return trimmed(stored)[0]

    bare = trimmed(a.content)[0]
    reasoning = fit(a.reasoning, lambda r: (r, bare))
    return reasoning, fit(a.content, lambda c: (reasoning, c))


def template_of(family: Family) -> str:
    """How a message names the template: the generic family's is just the chat template."""
    return "the chat template" if family.name == "template" else f"the {family.name} template"


def first_difference_at(a: str, b: str) -> int:
    same = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(same, min(len(a), len(b)))


def rendered_completion(
    family: Family, prompt: str, full: str, a: Answer, stops: tuple[str, ...]
) -> str:
    """The completion the template shows for answer `a`: `full` (history + answer, no
    generation prompt) after `prompt` (history + generation prompt), up to and including the
    end token the model emitted (none when the answer was cut at max_tokens)."""
    prompt, reasoning = _reasoning_put_back(family, prompt, full, a)
    if not full.startswith(prompt):
        at = first_difference_at(prompt, full)
        raise ReconstructError(
            f"{template_of(family)}'s render of the finished answer does not extend its "
            f"prompt (at character {at}: prompt {prompt[at : at + 24]!r}, finished "
            f"{full[at : at + 24]!r}): it rewrites the history or drops part of the answer; "
            "a family with a rule for it is needed (`regen families`)"
        )
    tail = reasoning + full[len(prompt) :]
    appended = family.appended_stop(bool(a.calls))
    if appended:
        body, stop = tail, appended
    else:
        found = [(tail.find(s), s) for s in stops if s and s in tail]
        if not found and a.truncated:  # a cut answer has no stop token to find
            found = [(len(tail), "")]
        if not found:
            raise ReconstructError(
                f"{template_of(family)} writes none of the end tokens {list(stops)} after "
                "the answer: set [reconstruct] stop to the token the model ends its turn with"
            )
        at, stop = min(found)
        body = tail[:at]
    if not a.truncated:
        return body + stop
    return _cut(family, body, a)


def _reasoning_put_back(family: Family, prompt: str, full: str, a: Answer) -> tuple[str, str]:
    """(the prompt to take the completion after, reasoning to put before it). A render that
    writes the finished turn in its closed form where the prompt pre-filled the opening tag
    (GLM's `</think>C`, DeepSeek-V4's encoder without tools: it drops the turn's reasoning)
    shows the model's closing tag in place of the opening: the model wrote its reasoning, then
    that tag. Any other render that drops the reasoning is refused (by the prefix check or the
    self-check), never patched."""
    close = family.think[1]
    if full.startswith(prompt):
        return prompt, ""
    reasoning = a.reasoning  # as stored: what the model wrote between the tags
    for p in family.prefills:
        head = prompt.removesuffix(p)
        if head != prompt and close not in p and full.startswith(head + close):
            if reasoning and reasoning in full[len(head) :]:
                return prompt, ""  # the render has it elsewhere: not this rule's case
            return head, reasoning
    return prompt, ""


def _cut(family: Family, body: str, a: Answer) -> str:
    """An answer cut at max_tokens: the render up to the end of the last text the model
    wrote (its reasoning if it was cut there, else its content), as stored; calls a cut
    answer still has were complete. A render that does not hold that text (a template that
    shows no reasoning for a turn without calls) cannot show the answer: refused."""
    if a.calls:
        return body
    what = "reasoning" if a.cut_in_reasoning else "content"
    last = a.reasoning if a.cut_in_reasoning else a.content
    if not last.strip():  # cut before it wrote anything of its reasoning: up to the closing tag
        return body.partition(family.think[1])[0] if a.cut_in_reasoning else body
    text = a.prefill + body  # a verbatim field may start in what the prompt pre-filled
    at = text.rfind(last)
    if at < 0:
        last = last.strip()
        at = text.rfind(last)
    end = at + len(last) - len(a.prefill)
    if at < 0 or end < 0:
        raise ReconstructError(
            f"{template_of(family)} does not show the {what} of an answer cut at "
            f"max_tokens (its render of the answer is {body[:48]!r}): the cut answer cannot "
            "be rebuilt from it; drop it (exports do by default)"
        )
    return body[:end]
