"""`regen audit` names what fails (issue 48): every failing sample with its reasons, a count
off its bill on either side, the argument and the schema rule of `arguments_off_schema`; its
worst list is sorted by the larger difference, prompt or completion."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from regen.outputs.audit import Checks, DatasetAudit, audit_json, sample_problems, structure
from regen.reconstruct import Sample, Target, TargetSpec, family
from regen.state.answers import ExportRow, pack_ids

SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["q"],
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]


def row(item: str, calls: list[dict[str, Any]] | None = None, **kw: Any) -> ExportRow:
    return ExportRow(
        item_id=item,
        turn_index=1,
        conversation={"messages": [{"role": "user", "content": "q"}], "tools": TOOLS},
        content="The answer." if not calls else "",
        reasoning=None,
        tool_calls=calls or [],
        finish_reason="tool_calls" if calls else "stop",
        **kw,
    )


def call(args: str) -> list[dict[str, Any]]:
    return [{"id": "c", "type": "function", "function": {"name": "lookup", "arguments": args}}]


def test_an_argument_off_its_schema_is_named_with_the_rule() -> None:
    markers = family("qwen3").markers
    details: list[str] = []
    problems = structure(row("a", call('{"q": "x", "days": 0}')), markers, Checks(), details)
    assert problems == ["arguments_off_schema"]
    assert details == [
        "tool lookup: argument $.days: 0 is less than the minimum of 1 (schema rule minimum)"
    ]
    details = []
    structure(row("b", call('{"days": 2}')), markers, Checks(), details)
    assert details == [
        "tool lookup: argument (the arguments object): 'q' is a required property "
        "(schema rule required)"
    ]


def built(target: Target, r: ExportRow, prompt_diff: int, completion_diff: int) -> Sample:
    [sample] = target.samples([r])
    assert isinstance(sample, Sample)
    return replace(sample, prompt_diff=prompt_diff, completion_diff=completion_diff)


def test_every_failing_sample_is_named_and_the_worst_are_sorted_on_either_side() -> None:
    target = Target(TargetSpec(family="qwen3"))
    audit = DatasetAudit("chat")
    cases = [
        (0, 0, row("fine", prompt_tokens=10, completion_tokens=5)),
        (40, 0, row("prompt-off", prompt_tokens=10, completion_tokens=5)),
        (0, 6, row("completion-off", prompt_tokens=10, completion_tokens=5)),
        (0, 0, row("schema", call('{"q": 1}'), prompt_tokens=10, completion_tokens=5)),
    ]
    for p, c, r in cases:
        v = sample_problems(r, built(target, r, p, c), target, Checks())
        audit.add(built(target, r, p, c), v.problems, 5, v.reparse, v.oracle,
                  v.problems_of_the_answer, v.details)  # fmt: skip
    data = audit_json([audit])["datasets"][0]
    failing = {f["item_id"]: f for f in data["failing"]}
    assert set(failing) == {"prompt-off", "completion-off", "schema"} and data["failed"] == 3
    assert failing["prompt-off"]["problems"] == ["prompt_off_billed"]
    assert (
        failing["prompt-off"]["details"] and "prompt rebuilt" in failing["prompt-off"]["details"][0]
    )
    assert failing["completion-off"]["problems"] == ["length_off_billed"]
    assert "schema rule type" in failing["schema"]["details"][0]
    # The prompt rebuilt 40 tokens off is the worst, though its completion matches.
    assert [w["item_id"] for w in data["worst"]] == ["prompt-off", "completion-off"]


def test_text_the_server_inserted_is_said_and_its_ids_win() -> None:
    """A server that answers `\\n\\n` before the content with thinking off: its ids (which the
    rebuild equals) hold none of it. The sample passes, and the audit says which text."""
    target = Target(TargetSpec(family="qwen3", thinking=False))
    messages = [{"role": "user", "content": "q"}]
    prompt_ids, completion_ids = target.encode_batch(
        [target.prompt_text(messages, None), "The answer.<|im_end|>"]
    )
    r = ExportRow(
        item_id="inserted",
        turn_index=1,
        conversation={"messages": messages},
        content="\n\nThe answer.",
        reasoning=None,
        tool_calls=[],
        finish_reason="stop",
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(completion_ids),
        prompt_token_ids=pack_ids(prompt_ids),
        completion_token_ids=pack_ids(completion_ids),
    )
    [sample] = target.samples([r])
    assert isinstance(sample, Sample) and sample.source == "exact"
    v = sample_problems(r, sample, target, Checks())
    assert v.problems == ["server_inserted_text"] and v.problems_of_the_answer == []
    assert v.details == [
        "the server inserted '\\n\\n' before the content it returned, which its token ids do "
        "not hold: the ids (which the rebuild equals) are kept as the answer"
    ]
    audit = DatasetAudit("chat")
    audit.add(sample, v.problems, 5, v.reparse, v.oracle, v.problems_of_the_answer, v.details)
    data = audit_json([audit])["datasets"][0]
    assert data["failed"] == 0 and data["notes"][0]["item_id"] == "inserted"
