"""The mistral family against mistral-common, Mistral's own encoder (the one vLLM renders
Mistral models with), never against regen.

regen hands mistral-common OpenAI-form messages (`ChatCompletionRequest.from_openai`) and
takes the completion as the finished conversation's ids after the prompt's. The oracle here
builds the same conversations from mistral-common's own message classes, by this test's own
mapping, and encodes them as Mistral documents: the prompt for serving, the finished answer
for finetuning (ended by `</s>`), an answer cut at max_tokens as an assistant prefix. One
answer per format is pinned by a string written here by hand from Mistral's output format.

Vocabularies: mistral-common bundles the v7 sentencepiece tokenizer (`[TOOL_CALLS][{...}]`)
and a tekken vocabulary without the v11/v13 control tokens; the v11 and v13 files here are
that vocabulary with mistral-common's own control tokens listed, the version set (v11:
`[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`; v13: no call id, `[THINK]...[/THINK]`). The format
is mistral-common's; the ids of a real v11+ model need its own tekken.json.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import mistral_common
import pytest
from mistral_common.protocol.instruct.chunk import TextChunk, ThinkChunk
from mistral_common.protocol.instruct.messages import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.base import SpecialTokens
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from regen.errors import ConfigError
from regen.outputs.audit import Checks, reparse, sample_problems
from regen.reconstruct import Target, TargetSpec
from regen.state.answers import ExportRow, pack_ids
from tests.reconstruct.corpus import CASES, CUT, Case

DATA = Path(mistral_common.__file__).parent / "data"
VERSIONS = ("v7", "v11", "v13")
THINKS = {"v13"}
"""The formats with a think chunk (`[THINK]`): a model before them writes no reasoning."""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each format's tokenizer file: the bundled v7 one; v11 and v13 as tekken.json folders
    (a model's download), the bundled tekken vocabulary with mistral-common's control tokens."""
    out = {"v7": str(DATA / "mistral_instruct_tokenizer_241114.model.v7")}
    base = json.loads((DATA / "tekken_240911.json").read_text("utf-8"))
    for version in ("v11", "v13"):
        folder = tmp_path_factory.mktemp(version)
        data = dict(base)
        data["config"] = {**base["config"], "version": version}
        data["special_tokens"] = [
            {"rank": i, "token_str": t.value, "is_control": True}
            for i, t in enumerate(SpecialTokens)
        ]
        (folder / "tekken.json").write_text(json.dumps(data), "utf-8")
        out[version] = str(folder)
    return out


# The oracle's side ----------------------------------------------------------------------


def mistral_id(cid: str) -> str:
    """A call id as Mistral's format takes them (nine letters or digits), the same for the
    same id."""
    return ("000000000" + "".join(c for c in cid if c.isalnum()))[-9:]


def mistral_case(case: Case, thinks: bool) -> Case:
    """The case as a client of a Mistral server sends it: call ids of nine letters or
    digits; reasoning only for a model that writes it."""

    def fix(m: dict[str, Any]) -> dict[str, Any]:
        m = dict(m)
        if not thinks:
            m.pop("reasoning", None)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": mistral_id(c["id"])} for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            m["tool_call_id"] = mistral_id(m["tool_call_id"])
        return m

    return replace(
        case,
        history=[fix(m) for m in case.history],
        reasoning=case.reasoning if thinks else "",
        calls=[fix({"tool_calls": [c]})["tool_calls"][0] for c in case.calls],
    )


def native(m: dict[str, Any], cut: str = "") -> Any:
    """One message as mistral-common's own class."""
    if m["role"] == "system":
        return SystemMessage(content=m["content"])
    if m["role"] == "user":
        return UserMessage(content=m["content"])
    if m["role"] == "tool":
        return ToolMessage(content=m["content"], tool_call_id=m["tool_call_id"], name=m.get("name"))
    reasoning = m.get("reasoning") or m.get("reasoning_content")
    content: Any = m["content"] or None
    if reasoning:
        chunks: list[Any] = [ThinkChunk(thinking=reasoning, closed=cut != "reasoning")]
        content = chunks + ([TextChunk(text=m["content"])] if m["content"] else [])
    calls = [
        ToolCall(
            id=c["id"],
            function=FunctionCall(
                name=c["function"]["name"], arguments=json.loads(c["function"]["arguments"])
            ),
        )
        for c in m.get("tool_calls") or []
    ]
    return AssistantMessage(content=content, tool_calls=calls or None, prefix=bool(cut))


def request(messages: list[Any], tools: list[dict[str, Any]] | None) -> ChatCompletionRequest:
    defs = [
        Tool(
            function=Function(
                name=t["function"]["name"],
                description=t["function"]["description"],
                parameters=t["function"]["parameters"],
            )
        )
        for t in tools or []
    ]
    return ChatCompletionRequest(messages=messages, tools=defs or None)


@cache
def tokenizer(path: str, mode: ValidationMode) -> MistralTokenizer:
    file = path if path.endswith(".v7") else f"{path}/tekken.json"
    return MistralTokenizer.from_file(file, mode=mode)


def oracle(path: str, case: Case, cut: str = "") -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) as mistral-common encodes the conversation."""
    serve = tokenizer(path, ValidationMode.test)
    train = tokenizer(path, ValidationMode.finetuning)
    history = [native(m) for m in case.history]
    prompt = serve.encode_chat_completion(request(history, case.tools)).tokens
    answer = native(case.answer, cut)
    if cut:
        full = serve.encode_chat_completion(request([*history, answer], case.tools)).tokens
    else:
        full = train.encode_chat_completion(request([*history, answer], case.tools)).tokens
    assert full[: len(prompt)] == prompt
    return list(prompt), list(full[len(prompt) :])


def _params() -> list[Any]:
    return [
        pytest.param(v, case, id=f"{v}-{case.name}")
        for v in VERSIONS
        for case in [*CASES, *CUT]
        if v in THINKS or case.name != "cut_in_reasoning"
    ]


# regen's side ---------------------------------------------------------------------------


def stored_row(case: Case, **billed: Any) -> ExportRow:
    """The answer as vLLM's mistral parsers store it: the reasoning between the think tags,
    the content before `[TOOL_CALLS]`, each call; nothing around them is Mistral's layout."""
    cut = case.name.startswith("cut_")
    return ExportRow(
        item_id=f"it-{case.name}",
        turn_index=len(case.history),
        conversation={"messages": [*case.history, case.answer], "tools": case.tools},
        content=case.content,
        reasoning=case.reasoning or None,
        tool_calls=case.calls,
        finish_reason="length" if cut else "tool_calls" if case.calls else "stop",
        **billed,
    )


@pytest.mark.parametrize(("version", "case"), _params())
def test_ids_are_mistral_commons(version: str, case: Case, files: dict[str, str]) -> None:
    case = mistral_case(case, version in THINKS)
    cut = ""
    if case.name.startswith("cut_"):
        cut = "reasoning" if not case.content else "content"
    prompt, completion = oracle(files[version], case, cut)
    t = Target(TargetSpec(family="mistral", tokenizer=files[version]))
    row = stored_row(case, prompt_tokens=len(prompt), completion_tokens=len(completion))
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception), sample
    assert sample.prompt_ids == prompt
    assert sample.completion_ids == completion
    assert sample.lost is None, sample.lost
    assert reparse(row, sample, t) is None
    assert sample_problems(row, sample, t, Checks()).problems == []


GOLDEN = {
    ("v7", "parallel_calls"): (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Tokyo"}, "id": '
        '"000callc3"}, {"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}, "id": '
        '"000callc4"}]</s>'
    ),
    ("v11", "content_then_calls"): (
        "Let me check the weather.[TOOL_CALLS]get_weather[CALL_ID]000callb2"
        '[ARGS]{"city": "Paris", "unit": "c"}</s>'
    ),
    ("v13", "reasoning"): (
        "[THINK]17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.[/THINK]17 × 23 = **391**.</s>"
    ),
    ("v13", "parallel_calls"): (
        '[THINK]Two independent lookups.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}'
        '[TOOL_CALLS]get_time[ARGS]{"tz": "Asia/Tokyo"}</s>'
    ),
}


@pytest.mark.parametrize(("version", "name"), sorted(GOLDEN))
def test_the_oracle_is_mistrals_output_format(
    version: str, name: str, files: dict[str, str]
) -> None:
    [case] = [mistral_case(c, version in THINKS) for c in CASES if c.name == name]
    t = Target(TargetSpec(family="mistral", tokenizer=files[version]))
    _, completion = oracle(files[version], case)
    assert t.decode(completion) == GOLDEN[version, name]


def test_auto_picks_mistral_from_the_models_tokenizer_file(files: dict[str, str]) -> None:
    t = Target(TargetSpec(family="auto", tokenizer=files["v13"]))
    assert t.family.name == "mistral"
    assert t.notes == ["family auto: mistral, from tekken.json (mistral-common)"]
    assert "v13" in t.template


def test_a_folder_without_mistrals_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"tekken\.json or tokenizer\.model\.v\*"):
        Target(TargetSpec(family="mistral", tokenizer=str(tmp_path)))


def test_reasoning_for_a_model_without_think_chunks_is_refused(files: dict[str, str]) -> None:
    """A v7 model writes no reasoning: a stored one cannot be its output. Refused in one
    line, the encoder's own words, never exported without it."""
    [case] = [mistral_case(c, thinks=False) for c in CASES if c.name == "reasoning"]
    t = Target(TargetSpec(family="mistral", tokenizer=files["v7"]))
    [sample] = t.samples([stored_row(replace(case, reasoning="I think."))])
    assert isinstance(sample, Exception)
    assert str(sample).startswith("it-reasoning: mistral encoder: ")
    assert "\n" not in str(sample)


def test_arguments_written_otherwise_show_against_the_servers_ids(files: dict[str, str]) -> None:
    """What is assumed (the model writes arguments as mistral-common serializes them) is
    checked wherever the server returns ids: a model that wrote `{"city":"Paris"}` gives
    other ids than the rebuild, and the audit names where."""
    [case] = [mistral_case(c, thinks=True) for c in CASES if c.name == "calls_only"]
    prompt, _ = oracle(files["v13"], case)
    tok = tokenizer(files["v13"], ValidationMode.test).instruct_tokenizer.tokenizer
    tight = tok.encode('get_weather[ARGS]{"city":"Paris"}', bos=False, eos=False)
    think = [tok.get_special_token("[THINK]"), *tok.encode(case.reasoning, bos=False, eos=False)]
    written = [
        *think,
        tok.get_special_token("[/THINK]"),
        tok.get_special_token("[TOOL_CALLS]"),
        *tight,
        tok.eos_id,
    ]
    t = Target(TargetSpec(family="mistral", tokenizer=files["v13"]))
    row = stored_row(
        case,
        prompt_token_ids=pack_ids(prompt),
        completion_token_ids=pack_ids(written),
        prompt_tokens=len(prompt),
        completion_tokens=len(written),
    )
    [sample] = t.samples([row])
    assert not isinstance(sample, Exception), sample
    assert sample.source == "exact" and sample.completion_ids == written
    verdict = sample_problems(row, sample, t, Checks())
    assert verdict.problems == ["rebuild_differs_from_server"]
    assert verdict.oracle is not None and "completion token" in verdict.oracle


def test_audit_and_export_rebuild_a_runs_answers_with_mistral_common(
    tmp_path: Path, files: dict[str, str]
) -> None:
    """The family through the commands a user runs, over a real run's state.db (the
    simulator's plain ChatML model, which writes no reasoning): every answer is rebuilt by
    mistral-common, and the tokenized export holds its ids, the completion ending in `</s>`.
    (The simulator bills with its own tokenizer, so the counts differ from the bill: the
    audit says so, answer by answer, and nothing else.)"""
    import pyarrow.parquet as pq

    from regen.sim import SimConfig, sim_in_thread
    from tests.conftest import run_cli, write_job, write_rows

    rows = [{"messages": [{"role": "user", "content": f"Explain step {i}"}]} for i in range(12)]
    write_rows(tmp_path / "chat.jsonl", rows)
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        job.write_text(job.read_text().replace("moonshotai/kimi-k2.5", "sim/chatml"))
        assert run_cli("run", str(job)).returncode == 0
    out = tmp_path / "out"
    flags = ["--family", "mistral", "--tokenizer", files["v7"]]
    res = run_cli("audit", str(out), *flags, "--include-truncated", "--json")
    overall = json.loads(res.stdout)["overall"]
    assert overall["samples"] == 12
    assert set(overall["problems"]) <= {"length_off_billed", "prompt_off_billed"}, overall
    to = str(tmp_path / "t")
    res = run_cli(
        "export", str(out), "--format", "tokenized", *flags, "--keep-truncated", "--to", to
    )
    assert res.returncode == 0, res.stderr
    [part] = (tmp_path / "t").rglob("*.parquet")
    table = pq.read_table(part).to_pylist()
    assert len(table) == 12
    tok = tokenizer(files["v7"], ValidationMode.test).instruct_tokenizer.tokenizer
    for record in table:
        ids = record["input_ids"]
        assert ids[0] == tok.bos_id
        assert (ids[-1] == tok.eos_id) == (record["finish_reason"] != "length")
        assert ids[: record["n_prompt"]][-1] == tok.get_special_token("[/INST]")
        assert sum(record["loss_mask"]) == record["n_completion"] > 1


def test_a_hostile_rows_text_in_the_encoders_error_is_escaped(
    tmp_path: Path, files: dict[str, str]
) -> None:
    """An encoder's error quotes the row (mistral-common names the call id it refuses): what
    `regen audit` prints of it holds no raw control characters, so a row cannot drive the
    terminal."""
    from regen.sim import SimConfig, sim_in_thread
    from tests.conftest import run_cli, write_job, write_rows

    cid = "\x1b]0;owned\x07\x1b[2J"
    call = {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "Call f."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": cid, "content": "done"},
    ]
    write_rows(tmp_path / "chat.jsonl", [{"messages": history}])
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        job.write_text(job.read_text().replace("moonshotai/kimi-k2.5", "sim/chatml"))
        assert run_cli("run", str(job)).returncode == 0
    flags = ["--family", "mistral", "--tokenizer", files["v7"], "--include-truncated"]
    res = run_cli("audit", str(tmp_path / "out"), *flags)
    assert "mistral encoder: Tool call id was" in res.stdout, res.stdout
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b" in res.stdout
