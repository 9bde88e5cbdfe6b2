"""The target's token ids for each stored answer: prompt ids from the tokenizer's own chat
template, completion ids from the family's grammar, or the server's exact ids where it
returned them.

The prompt is rendered once per answer from the messages the request sent (the history with
its reasoning, the tools) with the generation prompt, and never from a re-rendered finished
conversation: Kimi's template drops the reasoning of earlier turns, so that would lose the
very tokens the drafter must learn.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from regen.errors import ConfigError, first_line
from regen.reconstruct.check import lost
from regen.reconstruct.encoders import (
    IDS_ENCODERS,
    IdsEncoder,
    encoder,
    encoder_family_of,
    ids_encoder,
)
from regen.reconstruct.families import (
    AUTO,
    FAMILIES,
    Answer,
    Family,
    auto_without_template,
    detect,
    family,
    matched,
    unchecked,
)
from regen.reconstruct.folder_rules import (
    generation_eos,
    stops_disagree,
    template_end,
    unset_variables,
)
from regen.reconstruct.kimi_ts import sorted_keys, tools_typescript
from regen.reconstruct.rendered import (
    ReconstructError,
    first_difference_at,
    fitted_fields,
    rendered_completion,
)

__all__ = [
    "ReconstructError",
    "Sample",
    "StoredAnswer",
    "Target",
    "TargetSpec",
    "sim_template",
    "spec_from_store",
]


class StoredAnswer(Protocol):
    """An answer as it was stored, what a rebuild reads of it (the rows state.db's answers
    hands out are such): reconstruction knows nothing of state.db or how it keeps ids."""

    @property
    def item_id(self) -> str: ...
    @property
    def conversation(self) -> dict[str, Any]: ...
    @property
    def content(self) -> str: ...
    @property
    def reasoning(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[dict[str, Any]]: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def created_at(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def exact_prompt_ids(self) -> list[int] | None: ...
    @property
    def exact_completion_ids(self) -> list[int] | None: ...
    def history(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class TargetSpec:
    """How to rebuild ids: `[reconstruct]` in the job file, or `regen audit/export` flags."""

    family: str
    tokenizer: str = "sim"
    """`sim` (the simulator's tokenizer with the family's template), a folder with
    tokenizer files, a tokenizer.json, or a Hugging Face hub id."""
    chat_template: str | None = None
    """A Jinja file that replaces the tokenizer's own chat template."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking: bool = True
    """Whether the requests asked for reasoning (from `[generation] reasoning`)."""
    trust_remote_code: bool = False
    stop: str | None = None
    """The token the model ends its turn with, for a template family whose template writes
    several or none (default: the family's, else the tokenizer's end tokens)."""


@cache
def _hf_tokenizer(spec: str, trust_remote_code: bool) -> Any:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no notice about PyTorch
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        if spec == "sim":
            path = resources.files("regen.sim").joinpath("tokenizer")
            return AutoTokenizer.from_pretrained(str(path))
        p = Path(spec).expanduser()
        if p.is_file():
            if (p.parent / "tokenizer_config.json").is_file():  # its special tokens are there
                return AutoTokenizer.from_pretrained(
                    str(p.parent), tokenizer_file=str(p), trust_remote_code=trust_remote_code
                )
            return PreTrainedTokenizerFast(tokenizer_file=str(p))  # type: ignore[no-untyped-call]
        if p.is_dir():
            return AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
        if spec.startswith(("/", ".", "~")) or spec.endswith(".json"):
            raise ConfigError(f"tokenizer {spec!r}: no such file or folder")
        return AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
    except ConfigError:
        raise
    except Exception as exc:  # the library raises many kinds; each becomes one line
        raise ConfigError(f"tokenizer {spec!r}: cannot load: {first_line(exc)}") from exc


def sim_template(family_name: str) -> str:
    """The chat template that goes with the simulator's rendering of a family's prompts."""
    path = resources.files("regen.sim").joinpath("tokenizer", "templates", f"{family_name}.jinja")
    return path.read_text(encoding="utf-8")


def read_template(spec: TargetSpec, tok: Any) -> str:
    """The chat template: the job's file, the simulator's for its family, else the
    tokenizer's own (its default one where it names several)."""
    template: str | None
    if spec.chat_template:
        try:
            template = Path(spec.chat_template).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"chat_template {spec.chat_template!r}: {exc}") from exc
    elif spec.tokenizer == "sim":
        template = sim_template(spec.family)
    else:
        template = getattr(tok, "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default") or next(iter(template.values()), None)
    if not template:
        raise ConfigError(
            f"tokenizer {spec.tokenizer!r} has no chat template; give one with "
            "--chat-template FILE (or chat_template in [reconstruct])"
        )
    return str(template)


@dataclass
class Sample:
    """One answer as training ids: `input_ids` = prompt + completion, loss on the completion."""

    item_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    source: str
    """`exact` (the server's ids) or `reconstructed`."""
    prompt_diff: int
    """Rebuilt minus billed prompt tokens."""
    completion_diff: int
    """Rebuilt minus billed completion tokens."""
    prefill: str = ""
    """What the prompt pre-filled of the answer (the family's `prefills`)."""
    rebuilt_prompt_ids: list[int] | None = None
    rebuilt_completion_ids: list[int] | None = None
    """Where the ids are the server's: the same answer rebuilt from its text (template and
    grammar), to compare with them (None where the server gave no ids, or it failed)."""
    lost: str | None = None
    """The self-check (check.py): the first part of the stored answer its rebuilt completion
    does not hold, or None. A sample that fails it is not exported as exact."""

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_ids) + [1] * len(self.completion_ids)


class Target:
    """A tokenizer, its chat template and a family: rebuilds the ids of stored answers."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        why = auto_without_template(spec.family, spec.tokenizer, spec.chat_template)
        if why is not None:
            raise ConfigError(why)
        self.family: Family = family(spec.family) if spec.family != AUTO else FAMILIES["template"]
        self.notes: list[str] = []
        """What the family rests on, said once at the start of an audit, export or run."""
        picked = encoder_family_of(spec.tokenizer) if spec.family == AUTO else None
        if picked is not None:  # a model whose publisher's encoder reads its files
            name, source = picked
            self.family = FAMILIES[name]
            self.notes.append(f"family auto: {name}, from {source}")
        from_template = spec.family == AUTO and picked is None
        self._ids: IdsEncoder | None = None
        if self.family.encoder in IDS_ENCODERS:
            self._init_ids()
            return
        self.tok = _hf_tokenizer(spec.tokenizer, spec.trust_remote_code)
        self._encoder = (
            encoder(self.family.encoder, spec.tokenizer, spec.trust_remote_code)
            if self.family.encoder
            else None
        )
        if self._encoder is not None:
            template = f"(the {self.family.encoder} encoder of {self.family.encoder_package})"
        else:
            template = read_template(spec, self.tok)
        self.template: str = template
        if from_template:
            self.family = detect(template, spec.thinking)
            self.notes.append(f"family auto: {self.family.name}, from its chat template")
            near = matched(template, spec.thinking)
            if near is not None and unchecked(near, template):
                self.notes.append(
                    f"the chat template holds {near.name}'s marks but is not a template its "
                    f"hand-written rules were checked on: the template writes the answers (set "
                    f'family = "{near.name}" to use the rules)'
                )
        if self.family.name == "template":
            self.notes.append(
                "family template: checked on every answer by the self-check (the finished "
                "render extends the prompt, nothing of the answer is lost, the count matches the "
                f"bill); assumed: {' '.join(self.family.assumed.split())}"
            )
        self.kwargs = self._template_kwargs()
        self.warnings: list[str] = [] if self._encoder else self._unset_variables()
        self._stop_refusal: str | None = None
        self.stops: tuple[str, ...] = self._stops()
        backend = getattr(self.tok, "backend_tokenizer", None) if self.tok.is_fast else None
        self._backend = backend

    def _init_ids(self) -> None:
        """A family whose publisher's encoder writes ids (mistral-common): no chat template,
        no Hugging Face tokenizer; the encoder reads the model's own tokenizer file."""
        self._ids = ids_encoder(self.family.encoder, self.spec.tokenizer)
        self.tok = None
        self._encoder = None
        self._backend = None
        version = getattr(self._ids, "version", "")
        f = self.family
        self.template = f"(the {f.encoder} encoder of {f.encoder_package}, {version})"
        self.kwargs = {}
        self.stops = self.family.stop
        self._stop_refusal = None
        self.warnings = []
        if self.spec.chat_template:
            self.warnings.append(
                f"chat_template {self.spec.chat_template!r} is not read: the {self.family.name} "
                f"family renders with {self.family.encoder_package}, as vLLM does"
            )

    def _template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.spec.tokenizer == "sim":
            # The special tokens the sim's one tokenizer names for the family, as each
            # model's own tokenizer_config.json does (DeepSeek's templates read bos_token).
            from regen.sim.chat import special_tokens

            kwargs.update(special_tokens(self.family.name))
        if self.family.thinking_kwarg:
            kwargs[self.family.thinking_kwarg] = self.spec.thinking
        kwargs.update(self.spec.template_kwargs)
        return kwargs

    def _stops(self) -> tuple[str, ...]:
        """The end tokens the model may emit, for a family the template writes: the job's
        `stop`, else the family's, else the tokenizer's eos_token and those of the model's
        generation_config.json beside it. For the generic family these must agree with the
        template's own end of turn, or every answer is refused (`_stop_refusal`)."""
        if self.spec.stop:
            return (self.spec.stop,)
        if self.family.stop:
            return self.family.stop
        eos = getattr(self.tok, "eos_token", None)
        eos = eos if isinstance(eos, str) and eos else None
        config = generation_eos(self.spec.tokenizer, self.tok)
        if self.family.name == "template":
            end = template_end(
                lambda turns: self._rendered(turns, None, None, generation=False)[0], self.tok
            )
            self._stop_refusal = stops_disagree(end, eos, config)
            if self._stop_refusal:
                self.notes.append(f"every answer refused: {self._stop_refusal}")
        return tuple(dict.fromkeys([*([eos] if eos else []), *(config or [])]))

    def _unset_variables(self) -> list[str]:
        """What the chat template reads that nothing here sets (`folder_rules`)."""
        known = {*self.kwargs, *self.family.reads}
        if self.family.name == "kimi-k2.5":
            known.add("tools_ts_str")  # regen writes it (kimi_ts.py)
        spec = self.spec
        return unset_variables(self.template, spec.tokenizer, spec.chat_template, self.tok, known)

    # ids ----------------------------------------------------------------------------------

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special-token text read as control tokens, nothing added."""
        if self._ids is not None:
            raise ReconstructError(
                f"the {self.family.name} family writes ids, not text: its texts are not encoded"
            )
        if self._backend is not None:
            encoded = self._backend.encode_batch(texts, add_special_tokens=False)
            return [list(e.ids) for e in encoded]
        return [list(self.tok.encode(t, add_special_tokens=False)) for t in texts]

    def decode(self, ids: list[int]) -> str:
        if self._ids is not None:
            return self._ids.decode(ids)
        return str(self.tok.decode(ids, skip_special_tokens=False))

    # text ---------------------------------------------------------------------------------

    def _message(self, m: dict[str, Any], parse_arguments: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("reasoning"):
            out[self.family.reasoning_key] = m["reasoning"]
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                out[key] = m[key]
        if m.get("tool_calls"):
            out["tool_calls"] = [_call(c, parse_arguments) for c in m["tool_calls"]]
        return out

    def prompt_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        when: float | None = None,
    ) -> str:
        """The prompt as the server renders it: history, tools, and the generation prompt.

        As vLLM and SGLang do, each history tool call's arguments go to the template parsed;
        a template that cannot take them parsed (DeepSeek-V3's joins them as text) gets the
        text, the only form a server could have rendered it with. `when` (the answer's time)
        is the date a template asks `strftime_now` for (gpt-oss's `Current date:`)."""
        if self._ids is not None:
            return self.decode(self._ids.prompt(messages, tools))
        return self._rendered(messages, tools, when, generation=True)[0]

    def _rendered(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        when: float | None,
        generation: bool,
        parse: bool | None = None,
    ) -> tuple[str, bool]:
        """The render, and whether the arguments went parsed (`parse`: as given; None: the
        family's rule, or parsed then text for a template that concatenates them)."""
        kwargs = dict(self.kwargs)
        if self._encoder is not None:
            try:
                return self._encoder(messages, tools, kwargs), False
            except Exception as exc:  # the encoder's own errors, one line each
                raise self._encoder_error(exc) from exc
        template = self.template
        if when is not None and "strftime_now" in template:
            template = dated(template, when)
        if tools and self.family.name.startswith("kimi"):
            tools = sorted_keys(tools)  # Kimi's tokenizer sorts every key of the tools
            if self.family.name == "kimi-k2.5" and "tools_ts_str" not in kwargs:
                ts = tools_typescript(tools)
                if ts is not None:  # else the template writes JSON, as Kimi's code leaves it
                    kwargs["tools_ts_str"] = ts
        if parse is None and self.family.arguments == "string":
            parse = False
        try:
            if parse is not None:
                return self._render(template, messages, tools, kwargs, parse, generation), parse
            try:
                return self._render(template, messages, tools, kwargs, True, generation), True
            except TypeError:  # a template that concatenates arguments as text
                return self._render(template, messages, tools, kwargs, False, generation), False
        except Exception as exc:  # a template's raise_exception, or a Jinja error
            first = first_line(exc)
            at = self._first_failing(template, messages, tools, kwargs, generation)
            what = f" message {at + 1} ({messages[at].get('role')})" if at is not None else ""
            raise ReconstructError(
                f"the {self.family.name} chat template cannot render{what}: {first} (the "
                "history does not fit this template, or it needs [reconstruct] template_kwargs "
                "or another family: `regen families`)"
            ) from exc

    def _first_failing(
        self,
        template: str,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        generation: bool,
    ) -> int | None:
        """The first message the template cannot render (each shorter history rendered the
        way the full one was, arguments parsed or as text); None if it fails only on the
        whole. Only run once a render has failed."""
        for n in range(1, len(messages) + 1):
            failed = True
            for parse in (True, False):
                try:
                    self._render(template, messages[:n], tools, kwargs, parse, generation)
                    failed = False
                    break
                except Exception:  # noqa: BLE001, S112 - the one that fails is the answer
                    continue
            if failed:
                return n - 1
        return None

    def _render(
        self,
        template: str,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        parse_arguments: bool,
        generation: bool = True,
    ) -> str:
        text = self.tok.apply_chat_template(
            [self._message(m, parse_arguments) for m in messages],
            tools=tools or None,
            chat_template=template,
            add_generation_prompt=generation,
            tokenize=False,
            **kwargs,
        )
        return str(text)

    def completion_text(self, row: StoredAnswer, prompt: str, prefill: str = "") -> str:
        """What the model wrote after `prompt` (the rendered prompt): the family's
        hand-written layout, or the template's own render of the finished answer."""
        a = self.answer(row, prefill)
        if self.family.layout is not None:
            return self.family.layout(a)
        if self._stop_refusal:
            raise ReconstructError(self._stop_refusal)
        history = row.history()
        when = row.created_at or None
        tools = row.conversation.get("tools")
        renders: dict[tuple[str, str], str] = {}

        def completion(reasoning: str, content: str) -> str:
            if (reasoning, content) not in renders:
                message = _answer_message(a, reasoning, content)
                full = self._rendered([*history, message], tools, when, generation=False)[0]
                renders[reasoning, content] = rendered_completion(
                    self.family, prompt, full, a, self.stops
                )
            return renders[reasoning, content]

        reasoning, content = fitted_fields(a, prefill, completion)
        return completion(reasoning, content)

    def _ids_sample(self, row: StoredAnswer) -> tuple[list[int], list[int]]:
        """(prompt ids, completion ids) from an encoder that writes ids: the finished
        conversation's ids after the prompt's. Fields go in as stored: such an encoder writes
        no separators of its own around them."""
        assert self._ids is not None
        a = self.answer(row)
        history = row.history()
        tools = row.conversation.get("tools")
        message = _answer_message(a, a.reasoning, a.content)
        cut = ("reasoning" if a.cut_in_reasoning else "content") if a.truncated else ""
        try:
            prompt = self._ids.prompt(history, tools)
            full = self._ids.finished([*history, message], tools, cut)
        except Exception as exc:  # the encoder's own errors, one line each
            raise self._encoder_error(exc) from exc
        if full[: len(prompt)] != prompt:
            at = first_difference_at(self.decode(prompt), self.decode(full))
            raise ReconstructError(
                f"the {self.family.encoder} encoder's finished answer does not extend its "
                f"prompt (at character {at})"
            )
        return prompt, full[len(prompt) :]

    def _encoder_error(self, exc: Exception) -> ReconstructError:
        """A publisher's encoder's own error, as one line naming the encoder."""
        return ReconstructError(f"{self.family.encoder} encoder: {first_line(exc)[:240]}")

    def answer(self, row: StoredAnswer, prefill: str = "") -> Answer:
        return Answer(
            reasoning=row.reasoning or "",
            content=row.content or "",
            calls=row.tool_calls,
            truncated=row.finish_reason == "length",
            thinking=self.spec.thinking,
            calls_before=sum(len(m.get("tool_calls") or []) for m in row.history()),
            prefill=prefill,
        )

    def prefill(self, prompt: str) -> str:
        """The longest of the family's pre-fills the prompt ends with."""
        return next((p for p in self.family.prefills if prompt.endswith(p)), "")

    # samples ------------------------------------------------------------------------------

    def samples(self, rows: Sequence[StoredAnswer]) -> list[Sample | ReconstructError]:
        """Each row's sample, or why it could not be built (one bad row never stops a batch).
        The texts of a batch are encoded together (a family whose encoder writes ids has
        them already).

        Where the server returned ids, the sample uses them, and the answer is also rebuilt
        (prompt through the template, completion through the family's grammar) into
        `rebuilt_prompt_ids` and `rebuilt_completion_ids`: the server's ids are the oracle
        that proves the rebuild."""
        texts: list[str] = []
        known: dict[int, list[int]] = {}
        plan = [self._plan(row, texts, known) for row in rows]
        unknown = [i for i in range(len(texts)) if i not in known]
        encoded = dict(known)
        if unknown:
            fresh = self.encode_batch([texts[i] for i in unknown])
            encoded.update(zip(unknown, fresh, strict=True))
        return [p if isinstance(p, ReconstructError) else _sample(p, encoded) for p in plan]

    def _plan(
        self, row: StoredAnswer, texts: list[str], known: dict[int, list[int]]
    ) -> _Plan | ReconstructError:
        """A row's texts to encode, appended to `texts` (or its ids, put in `known` at their
        places): its prompt and completion as rebuilt, and the server's ids if it has them."""
        exact_p = row.exact_prompt_ids
        exact_c = row.exact_completion_ids
        try:
            at = len(texts)
            if self._ids is not None:
                known[at], known[at + 1] = self._ids_sample(row)
                prompt, text = self.decode(known[at]), self.decode(known[at + 1])
                prefill = ""
            else:
                tools = row.conversation.get("tools")
                prompt = self.prompt_text(row.history(), tools, row.created_at or None)
                prefill = self.prefill(prompt)
                text = self.completion_text(row, prompt, prefill)
            missing = lost(self.answer(row, prefill), text)
            texts += [prompt, text]
        except ReconstructError as exc:
            if exact_p is None or exact_c is None:
                return ReconstructError(f"{row.item_id}: {exc}")
            at, prefill, missing = -1, "", None  # the server's ids stand; no rebuild
        if exact_p is not None and self.family.prefills:
            prefill = self.prefill(self.decode(exact_p[-8:]))
        return _Plan(row, exact_p, exact_c, prefill, at, missing)


def _sample(p: _Plan, encoded: dict[int, list[int]]) -> Sample:
    """A planned row's sample: the server's ids where it has them (the rebuild kept beside them
    as its proof), else the rebuilt ones."""
    row = p.row
    rebuilt_p = encoded[p.at] if p.at >= 0 else None
    rebuilt_c = encoded[p.at + 1] if p.at >= 0 else None
    prompt_ids = p.exact_prompt if p.exact_prompt is not None else rebuilt_p
    completion = p.exact_completion if p.exact_completion is not None else rebuilt_c
    assert prompt_ids is not None and completion is not None
    exact = p.exact_prompt is not None and p.exact_completion is not None
    return Sample(
        item_id=row.item_id,
        prompt_ids=prompt_ids,
        completion_ids=completion,
        source="exact" if exact else "reconstructed",
        prompt_diff=len(prompt_ids) - billed_prompt(row, len(prompt_ids)),
        completion_diff=len(completion) - row.completion_tokens,
        prefill=p.prefill,
        rebuilt_prompt_ids=rebuilt_p if p.exact_prompt is not None else None,
        rebuilt_completion_ids=rebuilt_c if p.exact_completion is not None else None,
        lost=p.lost,
    )


@dataclass(frozen=True)
class _Plan:
    """A row of a batch: its exact ids if any, and where its rebuilt texts are (-1: none)."""

    row: StoredAnswer
    exact_prompt: list[int] | None
    exact_completion: list[int] | None
    prefill: str
    at: int
    lost: str | None


def _answer_message(a: Answer, reasoning: str, content: str) -> dict[str, Any]:
    """The stored answer as the history message a template or encoder renders, with its
    reasoning and content in the form given (`fitted`; as stored for an encoder that writes
    no separators of its own)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    if a.calls:
        message["tool_calls"] = list(a.calls)
    return message


_STRFTIME = re.compile(r"""strftime_now\(\s*(['"])(.*?)\1\s*\)""")


def dated(template: str, when: float) -> str:
    """The template with each `strftime_now("FORMAT")` replaced by that time's text (UTC):
    the prompt an answer was generated from carried the date of its generation, not the
    date it is rebuilt on. (transformers passes template variables as plain data, so the
    function itself cannot be swapped.)"""
    day = datetime.fromtimestamp(when, tz=UTC)
    return _STRFTIME.sub(lambda m: json.dumps(day.strftime(m.group(2))), template)


def _call(call: dict[str, Any], parse: bool) -> dict[str, Any]:
    """A history tool call as the template gets it. Parsed, as vLLM does: text that is not
    JSON, or none, becomes `{}` (SGLang refuses such a request; either way no server renders
    the text)."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if parse and not isinstance(args, dict | list):
        try:
            args = json.loads(args) if isinstance(args, str) and args else {}
        except json.JSONDecodeError:
            args = {}
    return {**call, "function": {**fn, "arguments": args}}


def spec_from_store(
    meta: dict[str, Any] | None,
    generation: dict[str, Any] | None,
    server_kwargs: dict[str, Any] | None = None,
    **overrides: Any,
) -> TargetSpec:
    """The spec a job recorded (`[reconstruct]`, and whether it asked for reasoning), with
    command-line overrides (None leaves a value as recorded). `server_kwargs` are the
    `chat_template_kwargs` the requests sent (vLLM, SGLang): the server rendered with them."""
    base: dict[str, Any] = dict(meta or {})
    base.update({k: v for k, v in overrides.items() if v is not None})
    if not base.get("family"):
        raise ConfigError(
            "no template family: give --family (or family in the job's [reconstruct] section)"
        )
    reasoning = (generation or {}).get("reasoning") or {}
    thinking = not (reasoning.get("enabled") is False or reasoning.get("effort") == "none")
    kwargs = base.get("template_kwargs") or {}
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--template-kwargs is not JSON: {exc}") from exc
    if not isinstance(kwargs, dict):
        raise ConfigError("template_kwargs must be a JSON object")
    kwargs = {**(server_kwargs or {}), **kwargs}
    effort = reasoning.get("effort")
    name = str(base["family"])
    effort_kwarg = family(name).effort_kwarg if name != AUTO else ""
    if effort_kwarg and isinstance(effort, str) and effort_kwarg not in kwargs:
        kwargs = {**kwargs, effort_kwarg: effort}
    switch = family(name).thinking_kwarg if name != AUTO else None
    if switch and switch in kwargs:  # the template's own switch, set by hand, decides
        thinking = bool(kwargs[switch])
    return TargetSpec(
        family=str(base["family"]),
        tokenizer=str(base.get("tokenizer") or "sim"),
        chat_template=base.get("chat_template"),
        template_kwargs=kwargs,
        thinking=thinking,
        trust_remote_code=bool(base.get("trust_remote_code")),
        stop=base.get("stop") or None,
    )


def billed_prompt(row: Any, prompt_len: int) -> int:
    """The prompt tokens an answer's bill stands for. A sample sent with the prompt's other
    samples as one request (`n`, its settings say so) was billed a share of the one prompt:
    the prompt is then held to its own length (the server's ids are the check there)."""
    settings = getattr(row, "settings", None)
    if settings and '"n":' in settings:
        try:
            n = json.loads(settings).get("n")
        except (ValueError, AttributeError):
            n = None
        if isinstance(n, int) and n > 1:
            return prompt_len
    return int(row.prompt_tokens)
