"""Renderers that are not Jinja: a model publisher's own encoder, from the package it ships.

A family with `encoder` in families.toml renders its prompts (and the history plus a finished
answer) through that package instead of a chat template; the completion is then taken exactly
as for a template (rendered.py). regen never re-implements an encoder.

- `deepseek-v4`, `deepseek-v4.1`: DeepSeek's reference encoders for DeepSeek-V4 and
  V4.1-Flash (`deepseek-recipe` on PyPI, by deepseek-ai, MIT; the one SGLang renders V4
  with). Tool-call arguments go in as the JSON text the model wrote (the encoder takes
  nothing else), tools as definitions, reasoning as `reasoning_content`, and the job's
  reasoning setting as its thinking mode and effort.
- `deepseek-v3.2`: DeepSeek's encoder for V3.2, which DeepSeek publishes in the model's
  repository (`encoding/encoding_dsv32.py`) and in no package: regen runs the file from the
  model's folder, as transformers runs a model's own code (`trust_remote_code`), with the
  messages as SGLang hands them to it (the tools on the system message, reasoning as
  `reasoning_content`, arguments as the JSON text the model wrote).
- `mistral`: Mistral's own `mistral-common` (Apache-2.0), which vLLM renders Mistral models
  with. It writes token ids, not text (its text form is the tokenizer's), so the family works
  on ids: the prompt in its serving form, the finished conversation in its finetuning form
  (the answer ended by `</s>`), the completion the ids after the prompt's (`IdsEncoder`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any, Protocol

from regen.errors import ConfigError, first_line

Render = Callable[[list[dict[str, Any]], list[Any] | None, dict[str, Any]], str]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _deepseek_render(
    encoding: str, messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
) -> str:
    """DeepSeek's encoder of one model version (deepseek-recipe's `DeepseekV4Encoding`,
    `DeepseekV41Encoding`)."""
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
            raise ValueError(f"DeepSeek's {encoding} has no role {role!r}")
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
    return str(getattr(dr, encoding)().render_conversation(conversation).prompt)


ENCODERS: dict[str, tuple[str, Render]] = {
    "deepseek-v4": ("deepseek-recipe", partial(_deepseek_render, "DeepseekV4Encoding")),
    "deepseek-v4.1": ("deepseek-recipe", partial(_deepseek_render, "DeepseekV41Encoding")),
}


class IdsEncoder(Protocol):
    """A publisher's encoder that writes token ids (mistral-common): the family's rebuild is
    then ids throughout, its text only the decoded form (for the self-check and parse-back)."""

    def prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        """The history and tools as the server renders them for the next answer."""
        ...

    def finished(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, cut: str
    ) -> list[int]:
        """The history with its last message, the answer: ended by the model's end token, or
        (`cut`: "reasoning" or "content") as far as the model wrote when cut at max_tokens."""
        ...

    def decode(self, ids: list[int]) -> str: ...


_MISTRAL_FILE = re.compile(r"tekken.*\.json|.*\.model\.v\d+\w*")
"""The names mistral-common's own files have: tekken*.json (tiktoken-based, v3 on) or a
versioned sentencepiece model (`tokenizer.model.v3`, `..._241114.model.v7`)."""


def mistral_file(spec: str) -> Path | None:
    """The mistral-common tokenizer file a `tokenizer` setting names (the file, or one in
    the folder: tekken.json first, as a model's download holds it), or None."""
    if spec == "sim":
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return path if _MISTRAL_FILE.fullmatch(path.name) else None
    if not path.is_dir():
        return None
    found = sorted(p for p in path.iterdir() if _MISTRAL_FILE.fullmatch(p.name))
    found.sort(key=lambda p: p.name != "tekken.json")
    return found[0] if found else None


@cache
def _mistral_tokenizers(file: str) -> tuple[Any, Any]:
    """mistral-common's tokenizer of a file in its test (serving) and finetuning modes, loaded
    once a process (a tekken.json is some 15 MB of JSON)."""
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    try:
        serve = MistralTokenizer.from_file(file, mode=ValidationMode.test)
        return serve, MistralTokenizer.from_file(file, mode=ValidationMode.finetuning)
    except Exception as exc:  # its own errors, one line
        why = first_line(exc)
        raise ConfigError(f"tokenizer {file!r}: mistral-common cannot load it: {why}") from exc


class Mistral:
    """Mistral's mistral-common: `ChatCompletionRequest.from_openai` (its own reading of an
    OpenAI request: reasoning becomes a think chunk, arguments its JSON), encoded in test mode
    for the prompt and in finetuning mode for the finished answer. An answer cut at
    max_tokens is an assistant prefix (no end token), its reasoning an unclosed think chunk
    when it was cut there; one cut after complete calls is the finished form without `</s>`."""

    def __init__(self, spec: str) -> None:
        file = mistral_file(spec)
        if file is None:
            raise ConfigError(
                f"tokenizer {spec!r}: the mistral family reads the model's own tokenizer file, "
                "as mistral-common does: give its tekken.json or tokenizer.model.v* (or the "
                "folder it is in)"
            )
        self._serve, self._train = _mistral_tokenizers(str(file))
        self._tok: Any = self._serve.instruct_tokenizer.tokenizer
        self.version = str(self._tok.version.value)
        self.eos = self._tok.eos_id

    def _request(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> Any:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        return ChatCompletionRequest.from_openai(
            [_openai(m) for m in messages], tools=list(tools) if tools else None
        )

    def prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        return list(self._serve.encode_chat_completion(self._request(messages, tools)).tokens)

    def finished(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, cut: str
    ) -> list[int]:
        if cut and not messages[-1].get("tool_calls"):
            last = dict(messages[-1])
            if cut == "reasoning":  # the thought it was writing, unclosed
                thought = last.pop("reasoning", "")
                last["content"] = [{"type": "thinking", "thinking": thought, "closed": False}]
            request = self._request([*messages[:-1], last], tools)
            request.messages[-1].prefix = True
            return list(self._serve.encode_chat_completion(request).tokens)
        ids = list(self._train.encode_chat_completion(self._request(messages, tools)).tokens)
        return ids[:-1] if cut and ids and ids[-1] == self.eos else ids

    def decode(self, ids: list[int]) -> str:
        """The ids as text, each control token as its name, the rest as mistral-common
        decodes them (what vLLM returns for a completion's text)."""
        out: list[str] = []
        run: list[int] = []
        for i in [*ids, -1]:
            if i >= 0 and not self._tok.is_special(i):
                run.append(i)
                continue
            if run:
                out.append(self._tok.decode(run))
                run = []
            if i >= 0:
                out.append(self._tok.id_to_piece(i))
        return "".join(out)


def _openai(m: dict[str, Any]) -> dict[str, Any]:
    """A stored message as an OpenAI one (the keys mistral-common reads)."""
    out: dict[str, Any] = {"role": m.get("role"), "content": m.get("content") or ""}
    for key in ("reasoning", "tool_calls", "tool_call_id", "name"):
        if m.get(key):
            out[key] = m[key]
    return out


IDS_ENCODERS: dict[str, tuple[str, Callable[[str], IdsEncoder]]] = {
    "mistral": ("mistral-common", Mistral),
}


def _installed(name: str, package: str) -> None:
    try:
        __import__(package.replace("-", "_"))
    except ImportError as exc:
        raise ConfigError(
            f"family {name} renders with its publisher's encoder, package {package}: "
            f"pip install {package}"
        ) from exc


def ids_encoder(name: str, tokenizer: str) -> IdsEncoder:
    """The ids encoder of a family for a tokenizer setting, or a one-line error."""
    package, make = IDS_ENCODERS[name]
    _installed(name, package)
    return make(tokenizer)


def _deepseek_v32(module: Any) -> Render:
    """DeepSeek-V3.2's `encode_messages`, given the messages as SGLang prepares them."""

    def render(
        messages: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str:
        out = []
        for m in messages:
            m = {k: v for k, v in m.items() if v is not None}
            if "reasoning" in m:
                m["reasoning_content"] = m.pop("reasoning")
            if m.get("tool_calls"):
                m["tool_calls"] = [_text_arguments(c) for c in m["tool_calls"]]
            out.append(m)
        if tools:
            if not out or out[0].get("role") != "system":
                out.insert(0, {"role": "system", "content": ""})
            out[0] = {**out[0], "tools": list(tools)}
        mode = "thinking" if kwargs.get("thinking", True) else "chat"
        return str(module.encode_messages(out, thinking_mode=mode))

    return render


def _text_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {**call, "function": {**fn, "arguments": text}}


FOLDER_ENCODERS: dict[str, tuple[str, Callable[[Any], Render]]] = {
    "deepseek-v3.2": ("encoding/encoding_dsv32.py", _deepseek_v32),
}
"""Encoders a publisher ships only in the model's repository: the file, under the model's
folder, and what makes a render function of the module."""


def folder_of(tokenizer: str) -> Path | None:
    """The model folder a `tokenizer` setting names (the folder, or the one a file is in)."""
    if tokenizer == "sim":
        return None
    path = Path(tokenizer).expanduser()
    return path if path.is_dir() else path.parent if path.is_file() else None


def encoder_family_of(tokenizer: str) -> tuple[str, str] | None:
    """For `family = "auto"`: the family whose publisher's encoder reads the files a model's
    folder (or file) holds, and the file that says so (a Mistral model's tekken.json or
    tokenizer.model.v*, DeepSeek-V3.2's encoding/encoding_dsv32.py); None for any other."""
    mistral = mistral_file(tokenizer)
    if mistral is not None:
        return "mistral", f"{mistral.name} (mistral-common)"
    folder = folder_of(tokenizer)
    for name, (relative, _) in FOLDER_ENCODERS.items():
        if folder is not None and (folder / relative).is_file():
            return name, f"the model's {relative}"
    return None


def _folder_encoder(name: str, tokenizer: str, trust_remote_code: bool) -> Render:
    relative, make = FOLDER_ENCODERS[name]
    folder = folder_of(tokenizer)
    path = folder / relative if folder is not None else None
    if path is None or not path.is_file():
        raise ConfigError(
            f"family {name} renders with the encoder its publisher ships in the model's "
            f"repository ({relative}), which tokenizer {tokenizer!r} does not hold: set "
            "tokenizer to the model's folder with it (e.g. `huggingface-cli download "
            f"MODEL --include 'tokenizer*' '{relative.partition('/')[0]}/*' --local-dir DIR`)"
        )
    if not trust_remote_code:
        raise ConfigError(
            f"family {name} runs the model's own encoder ({path}): set trust_remote_code = "
            "true in [reconstruct] (or --trust-remote-code) to run it"
        )
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"regen_encoder_{name}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: not a Python file regen can load")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the model's own code: its first line
        raise ConfigError(f"{path}: cannot load: {first_line(exc)[:200]}") from exc
    return make(module)


def encoder(name: str, tokenizer: str = "sim", trust_remote_code: bool = False) -> Render:
    """The render function of an encoder, or a one-line error naming what to install or
    set."""
    if name in FOLDER_ENCODERS:
        return _folder_encoder(name, tokenizer, trust_remote_code)
    package, render = ENCODERS[name]
    _installed(name, package)
    return render
