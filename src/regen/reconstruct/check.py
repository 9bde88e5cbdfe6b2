"""The self-check every rebuilt answer passes before its ids count as exact: nothing of the
stored answer is lost on the way into the completion's text.

The reasoning, the content, each call's name and each argument's keys and values must appear
in the rebuilt completion, in that order, in one of the forms a template writes them (as text,
JSON-escaped, or as JSON or Python writes a number, a boolean or null). This needs no parser
and no knowledge of the family, so it holds for any template: a template or rule that drops
the reasoning, a call, or a value (or writes an object where the model wrote one) is caught.
The parse-back (parse.py) and the billed count (the audit) check what this cannot: the
separators between the parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from regen.reconstruct.families import Answer, call_parts


def _forms(v: Any) -> list[str]:
    """The texts a template may write for a value."""
    if isinstance(v, str):
        return [v, json.dumps(v, ensure_ascii=False)[1:-1], json.dumps(v)[1:-1]]
    forms = [json.dumps(v, ensure_ascii=False), json.dumps(v)]
    if isinstance(v, bool | None | int | float):
        forms.append(str(v))  # `{{ value | string }}` (Qwen's XML calls)
    if isinstance(v, dict | list):
        forms.append(json.dumps(v, ensure_ascii=False, separators=(",", ":")))
    return forms


def _pieces(a: Answer) -> Iterator[tuple[str, list[str]]]:
    """(what, the forms it may take) of each part of the answer, in the order written."""
    # The fields as stored: a server's parser keeps the model's whitespace (and the
    # template's separators, which the render holds too); a provider's stripped field is
    # the text alone.
    if a.reasoning.strip():
        yield "reasoning", [a.reasoning]
    if a.content.strip():
        yield "content", [a.content]
    for i, call in enumerate(a.calls):
        name, text = call_parts(call)
        yield f"tool call {i} name", [name]
        try:
            args = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            yield f"tool call {i} arguments", [text]
            continue
        if not isinstance(args, dict):
            yield f"tool call {i} arguments", _forms(args)
            continue
        for key, value in args.items():
            yield f"tool call {i} argument {key!r}", [str(key)]
            if isinstance(value, dict | list) and value:
                yield from ((f"tool call {i} argument {key!r}", f) for f in _leaves(value))
            else:
                yield f"tool call {i} argument {key!r} value", _forms(value)


def _leaves(value: Any) -> Iterator[list[str]]:
    """The forms of each key and scalar of a nested value, in order."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield [str(k), json.dumps(str(k))[1:-1]]
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield _forms(value)


def lost(a: Answer, completion: str) -> str | None:
    """The first part of the stored answer that the completion, after what the prompt
    pre-filled of it (`a.prefill`), does not hold where it should, byte for byte (None when
    every part is there, in order). An answer cut at max_tokens is checked the same way: what
    it wrote before the cut is stored, and its calls were complete."""
    completion = a.prefill + completion
    at = 0
    for what, all_forms in _pieces(a):
        forms = [f for f in all_forms if f]
        if not forms:  # an empty string value: nothing to find
            continue
        found = [(i, f) for f in forms if f and (i := completion.find(f, at)) >= 0]
        if not found:
            shown = forms[0] if len(forms[0]) <= 40 else forms[0][:37] + "..."
            return f"{what} {shown!r} is not in the rebuilt completion after character {at}"
        i, form = min(found)
        at = i + len(form)
    return None
