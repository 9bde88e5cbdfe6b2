"""gpt-oss against openai-harmony, the renderer and parser vLLM uses for it (o200k from
PyPI, offline: vocab.py).

- Prompts: regen's ids equal harmony's `render_conversation_for_completion` for every turn
  whose history has no tool result. (A tool result is one place where harmony, and so vLLM,
  and the published template, and so SGLang, disagree: the template writes it as a JSON
  string, harmony as it is; and a system prompt without tools, which the template follows
  with a blank line that harmony does not write. regen renders the template.)
- Completions: a final answer's ids equal harmony's rendering of the analysis and final
  messages, ending `<|return|>`; a call parses, with harmony's own parser, into the same
  messages as harmony's rendering of it (the model samples the recipient after the channel,
  harmony's renderer writes it after the role, and its parser reads both).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from regen.reconstruct import Target, TargetSpec
from tests.reconstruct import vocab
from tests.reconstruct.corpus import CASES, Case
from tests.reconstruct.test_reference import WHEN, stored_row

TEMPLATE = Path(__file__).parent / "templates" / "gpt-oss.jinja"


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Target]:
    base = tmp_path_factory.mktemp("o200k")
    enc = vocab.harmony_encoding(base / "vocab")
    folder = vocab.gpt_oss_folder(base / "vocab", base / "tok")
    target = Target(
        TargetSpec(family="gpt-oss", tokenizer=str(folder), chat_template=str(TEMPLATE))
    )
    return enc, target


def conversation(case: Case) -> Any:
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        Message,
        Role,
        SystemContent,
        ToolDescription,
    )

    day = datetime.fromtimestamp(WHEN, UTC).strftime("%Y-%m-%d")
    out = [
        Message.from_role_and_content(
            Role.SYSTEM, SystemContent.new().with_conversation_start_date(day)
        )
    ]
    system = "\n\n".join(m["content"] for m in case.history if m["role"] == "system")
    if system or case.tools:
        dev = DeveloperContent.new()
        if system:
            dev = dev.with_instructions(system)
        if case.tools:
            dev = dev.with_function_tools(
                [
                    ToolDescription.new(
                        t["function"]["name"],
                        t["function"]["description"],
                        parameters=t["function"]["parameters"],
                    )
                    for t in case.tools
                ]
            )
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    for m in case.history:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant" and m.get("tool_calls"):
            if m.get("reasoning"):
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel(
                        "analysis"
                    )
                )
            fn = m["tool_calls"][0]["function"]
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, fn["arguments"])
                .with_channel("commentary")
                .with_recipient(f"functions.{fn['name']}")
                .with_content_type("json")
            )
        elif m["role"] == "assistant":
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final")
            )
        elif m["role"] == "tool":
            out.append(
                Message.from_author_and_content(
                    Author.new(Role.TOOL, f"functions.{m['name']}"), m["content"]
                )
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    return Conversation.from_messages(out)


def answer_messages(case: Case) -> list[Any]:
    from openai_harmony import Message, Role

    out = []
    if case.reasoning:
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, case.reasoning).with_channel("analysis")
        )
    if case.calls:
        fn = case.calls[0]["function"]
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, fn["arguments"])
            .with_channel("commentary")
            .with_recipient(f"functions.{fn['name']}")
            .with_content_type("<|constrain|>json")
        )
    else:
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, case.content).with_channel("final")
        )
    return out


PROMPT_CASES = [
    c
    for c in CASES
    if not any(m["role"] == "tool" for m in c.history)
    and not (any(m["role"] == "system" for m in c.history) and not c.tools)
]
ONE_CALL = [c for c in CASES if len(c.calls) <= 1 and not (c.calls and c.content)]


@pytest.mark.parametrize("case", PROMPT_CASES, ids=[c.name for c in PROMPT_CASES])
def test_prompt_ids_are_harmonys(case: Case, harmony: tuple[Any, Target]) -> None:
    from openai_harmony import Role

    enc, target = harmony
    expected = enc.render_conversation_for_completion(conversation(case), Role.ASSISTANT)
    [ids] = target.encode_batch([target.prompt_text(case.history, case.tools, WHEN)])
    assert ids == list(expected)


@pytest.mark.parametrize("case", ONE_CALL, ids=[c.name for c in ONE_CALL])
def test_completion_is_what_harmony_writes_and_parses(
    case: Case, harmony: tuple[Any, Target]
) -> None:
    from openai_harmony import Role

    enc, target = harmony
    row = stored_row(case, case.reasoning, case.content, case.calls)
    [sample] = target.samples([row])
    assert not isinstance(sample, Exception), sample
    msgs = answer_messages(case)
    if not case.calls:
        ids: list[int] = []
        for m in msgs:
            ids += enc.render(m)
        ids[-1:] = enc.encode("<|return|>", allowed_special="all")  # the final <|end|>
        start = enc.encode("<|start|>assistant", allowed_special="all")
        assert ids[: len(start)] == start
        assert sample.completion_ids == ids[len(start) :]
        return
    # A call: harmony's parser reads regen's ids as the same messages as its own rendering.
    rendered: list[int] = []
    for m in msgs:
        rendered += enc.render(m)
    start = len(enc.encode("<|start|>assistant", allowed_special="all"))
    want = enc.parse_messages_from_completion_tokens(rendered[start:], Role.ASSISTANT)
    got = enc.parse_messages_from_completion_tokens(sample.completion_ids, Role.ASSISTANT)
    assert [m.to_dict() for m in got] == [m.to_dict() for m in want]
