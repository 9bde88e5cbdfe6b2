"""The oracle's side of a chat template: a published template (templates/, see SOURCES.md)
rendered the way a server renders it, written here from the servers' documented behaviour and
not from regen's code.

- The Jinja environment is the one transformers compiles chat templates in (and so vLLM and
  SGLang): sandboxed, `trim_blocks` and `lstrip_blocks`, loop controls, `tojson` without ASCII
  escaping, `raise_exception` and `strftime_now`.
- Messages are prepared as vLLM prepares a request's history: each history tool call's
  `arguments` string is parsed into an object first.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

TEMPLATES = Path(__file__).parent / "templates"


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
    sort_keys: bool = False,
) -> str:  # fmt: skip
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@cache
def template(name: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))


def server_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's messages as vLLM hands them to the template: arguments parsed."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                fn["arguments"] = json.loads(args) if args else {}
    return out


def render(
    name: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool,
    prepare: bool = True,
    **kwargs: Any,
) -> str:
    msgs = server_messages(messages) if prepare else messages
    return template(name).render(
        messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
