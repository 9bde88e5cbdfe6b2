"""A completion from the model's own chat template: what the template writes for the history
plus the finished answer, after what it writes for the history with the generation prompt.

The few things a template does not show are the family's rules (families.toml), never code
here: the end token it does not write, and where several end tokens exist, which one ends the
turn. An answer the template cannot show (its render of the finished answer does not extend
the prompt, or has no end token) is an error naming what to set, never a guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regen.reconstruct.families import Answer, Family


class ReconstructError(Exception):
    """One answer's ids cannot be built (its prompt does not render, or the template cannot
    show its answer)."""


def without_separators(field: str) -> str:
    """A stored reasoning or content as the template gets it: a server's parsers hand fields
    back with the newlines around them that the template writes itself (vLLM: `R\\n`,
    `\\n\\nC\\n` before a call), so those go; any other whitespace is the model's."""
    return field.strip("\n")


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
            f"the {family.name} template's render of the finished answer does not extend its "
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
        if not found:
            raise ReconstructError(
                f"the {family.name} template writes none of the end tokens {list(stops)} after "
                "the answer: set [reconstruct] stop to the token the model ends its turn with"
            )
        at, stop = min(found)
        body = tail[:at]
    if not a.truncated:
        return body + stop
    return _cut(body, a, family.think[1])


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
    reasoning = without_separators(a.reasoning)
    for p in family.prefills:
        head = prompt.removesuffix(p)
        if head != prompt and close not in p and full.startswith(head + close):
            if reasoning and reasoning in full[len(head) :]:
                return prompt, ""  # the render has it elsewhere: not this rule's case
            return head, reasoning
    return prompt, ""


def _cut(body: str, a: Answer, close: str) -> str:
    """An answer cut at max_tokens: the render up to the end of the last text the model
    wrote (its reasoning if it was cut there, else its content); calls a cut answer still
    has were complete."""
    if a.calls:
        return body
    last = (a.reasoning if a.cut_in_reasoning else a.content).strip()
    if not last:  # cut before it wrote anything of its reasoning: up to the closing tag
        return body.partition(close)[0] if a.cut_in_reasoning else body
    at = body.rfind(last)
    return body[: at + len(last)] if at >= 0 else body
