"""Renderers that are not Jinja: a model publisher's own encoder, from the package it ships.

A family with `encoder` in families.toml renders its prompts (and the history plus a finished
answer) through that package instead of a chat template; the completion is then taken exactly
as for a template (rendered.py). regen never re-implements an encoder.

- `deepseek-v4`: DeepSeek's reference encoder for DeepSeek-V4 (`deepseek-recipe` on PyPI, by
  deepseek-ai, MIT; the one SGLang renders V4 with). Tool-call arguments go in as the JSON text
  the model wrote (the encoder takes nothing else), tools as definitions, reasoning as
  `reasoning_content`, and the job's reasoning setting as its thinking mode and effort.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from regen.errors import ConfigError

Render = Callable[[list[dict[str, Any]], list[Any] | None, dict[str, Any]], str]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _deepseek_v4(
    messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
) -> str:
    import deepseek_recipe as dr

    out: list[Any] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            out.append(dr.SystemMessage(_text(m.get("content"))))
        elif role == "user":
            out.append(dr.UserMessage(_text(m.get("content"))))
        elif role == "tool":
            out.append(dr.ToolMessage(_text(m.get("content")), tool_call_id=m.get("tool_call_id")))
        elif role == "assistant":
            calls = []
            for i, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") or {}
                args = fn.get("arguments")
                text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                cid = str(c.get("id") or f"call_{i}")
                calls.append(dr.ToolCall(cid, str(fn.get("name")), text))
            out.append(
                dr.AssistantMessage(
                    _text(m.get("content")),
                    reasoning_content=m.get("reasoning") or None,
                    tool_calls=calls or None,
                )
            )
        else:
            raise ValueError(f"the DeepSeek-V4 encoder has no role {role!r}")
    definitions = [
        dr.ToolDefinition(
            str((t.get("function") or {}).get("name")),
            (t.get("function") or {}).get("description"),
            (t.get("function") or {}).get("parameters"),
        )
        for t in tools or []
        if isinstance(t, dict)
    ]
    conversation = dr.Conversation(
        out,
        thinking_mode=bool(kwargs.get("thinking", True)),
        tools=definitions or None,
        reasoning_effort=kwargs.get("reasoning_effort"),
    )
    return str(dr.DeepseekV4Encoding().render_conversation(conversation).prompt)


ENCODERS: dict[str, tuple[str, Render]] = {
    "deepseek-v4": ("deepseek-recipe", _deepseek_v4),
}


def encoder(name: str) -> Render:
    """The render function of an encoder, or a one-line error naming the package to install."""
    package, render = ENCODERS[name]
    try:
        __import__(package.replace("-", "_"))
    except ImportError as exc:
        raise ConfigError(
            f"family {name} renders with its publisher's encoder, package {package}: "
            f"pip install {package}"
        ) from exc
    return render
