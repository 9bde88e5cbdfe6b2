"""Answers cut at max_tokens go through the same self-check as finished ones: the render of
the prefix the template would show, compared with what was stored; refused, one line per
answer, where the template cannot show them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow

# The shape of Command R7B's assistant turn (CohereForAI c4ai-command-r7b-12-2024, as
# llama.cpp's models/templates keeps it): reasoning only with calls, otherwise
# `<|START_RESPONSE|>{content}<|END_RESPONSE|>`. Reduced here to that turn.
R7B_SHAPE = (
    "{% for m in messages %}<|START_OF_TURN_TOKEN|>"
    "{% if m.role == 'user' %}<|USER_TOKEN|>{{ m.content }}"
    "{% else %}<|CHATBOT_TOKEN|>"
    "{% if m.tool_calls %}<|START_THINKING|>{{ m.reasoning_content }}<|END_THINKING|>"
    "<|START_ACTION|>{{ m.tool_calls | tojson }}<|END_ACTION|>"
    "{% else %}<|START_RESPONSE|>{{ m.content }}<|END_RESPONSE|>{% endif %}{% endif %}"
    "<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
)
# The same with the reasoning shown (a template that can show a cut answer).
SHOWS = R7B_SHAPE.replace(
    "<|START_RESPONSE|>{{ m.content }}",
    "{% if m.reasoning_content %}<|START_THINKING|>{{ m.reasoning_content }}<|END_THINKING|>"
    "{% endif %}<|START_RESPONSE|>{{ m.content }}",
)


def _target(tmp_path: Path, template: str) -> Target:
    path = tmp_path / "t.jinja"
    path.write_text(template)
    spec = TargetSpec(family="template", chat_template=str(path), stop="<|END_OF_TURN_TOKEN|>")
    return Target(spec)


def _cut(reasoning: str, content: str) -> ExportRow:
    history = [{"role": "user", "content": "Tell me a story."}]
    return ExportRow(
        item_id="cut",
        turn_index=1,
        conversation={"messages": [*history, {"role": "assistant", "content": ""}]},
        content=content,
        reasoning=reasoning or None,
        tool_calls=[],
        finish_reason="length",
    )


def test_an_answer_cut_in_reasoning_the_template_cannot_show_is_refused(tmp_path: Path) -> None:
    """Command R7B's template writes `<|START_RESPONSE|><|END_RESPONSE|>` for an answer cut
    inside its reasoning: tokens the model never wrote. Refused, saying why."""
    [sample] = _target(tmp_path, R7B_SHAPE).samples([_cut("The user wants a story; I", "")])
    assert isinstance(sample, Exception)
    line = str(sample)
    assert "\n" not in line and line.startswith("cut: the chat template does not show")
    assert "reasoning of an answer cut at max_tokens" in line


def test_a_cut_answer_that_loses_its_reasoning_fails_the_self_check(tmp_path: Path) -> None:
    [sample] = _target(tmp_path, R7B_SHAPE).samples([_cut("A short one.", "Once upon a")])
    assert not isinstance(sample, Exception), sample
    assert sample.lost is not None and sample.lost.startswith("reasoning"), sample.lost


def test_a_cut_answer_the_template_shows_is_its_prefix(tmp_path: Path) -> None:
    t = _target(tmp_path, SHOWS)
    for row, text in [
        (_cut("A short one.", "Once upon a\n"), "<|START_THINKING|>A short one.<|END_THINKING|>"
         "<|START_RESPONSE|>Once upon a\n"),
        (_cut("The user wants a story; I", ""), "<|START_THINKING|>The user wants a story; I"),
    ]:  # fmt: skip
        [sample] = t.samples([row])
        assert not isinstance(sample, Exception), sample
        assert t.decode(sample.completion_ids) == text
        assert sample.lost is None, sample.lost


def test_a_cut_answer_needs_no_stop_token(tmp_path: Path) -> None:
    """A template that writes none of the end tokens refuses finished answers (set
    [reconstruct] stop), but a cut answer ends without one: it is rebuilt (Seed-OSS answers
    cut in reasoning were refused with "set [reconstruct] stop")."""
    t = _target(tmp_path, SHOWS.replace("<|END_OF_TURN_TOKEN|>{% endfor %}", "{% endfor %}"))
    [cut] = t.samples([_cut("The user wants a story; I", "")])
    assert not isinstance(cut, Exception), cut
    assert t.decode(cut.completion_ids) == "<|START_THINKING|>The user wants a story; I"
    finished = replace(_cut("A short one.", "Once."), finish_reason="stop")
    [refused] = t.samples([finished])
    assert isinstance(refused, Exception) and "[reconstruct] stop" in str(refused)
