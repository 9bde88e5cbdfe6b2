"""`regen audit`: ids rebuilt from the chat template and the family's grammar match what the
simulator billed (its grammar and its prompt renderer are its own code), a wrong family or
tokenizer is caught, and the structural checks find what they say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from regen.outputs.audit import Checks, structure
from regen.reconstruct import Answer, Target, TargetSpec, family
from regen.sim import SimConfig, sim_in_thread
from regen.state.answers import ExportRow
from tests.conftest import run_cli, write_job, write_rows

FIXTURES = Path(__file__).parents[1] / "sources" / "fixtures"


def _run(tmp_path: Path, model: str, extra: str = "") -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"Explain step {i} in detail"}]}
        for i in range(40)
    ]
    write_rows(tmp_path / "chat.jsonl", rows)
    shutil.copy(FIXTURES / "b1_glaive.json", tmp_path / "glaive.json")
    with sim_in_thread(SimConfig(seed=9, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[("chat", "chat.jsonl", "openai"), ("glaive", "glaive.json", "glaive")],
            extra=extra,
        )
        job.write_text(
            job.read_text()
            .replace("moonshotai/kimi-k2.5", model)
            .replace("max_tokens = 512", "max_tokens = 2000")
        )
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
    return tmp_path / "out"


@pytest.mark.parametrize(
    ("model", "family_name"), [("moonshotai/kimi-k2.5", "kimi-k2.5"), ("qwen/qwen3-8b", "qwen3")]
)
def test_rebuilt_ids_match_the_billed_tokens(tmp_path: Path, model: str, family_name: str) -> None:
    out = _run(tmp_path, model)
    res = run_cli("audit", str(out), "--family", family_name, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    overall = json.loads(res.stdout)["overall"]
    assert overall["samples"] >= 40
    assert overall["mean_abs_diff"] == 0.0 and overall["match_share"] == 1.0
    assert overall["prompt_mean_abs_diff"] == 0.0 and overall["prompt_match_share"] == 1.0
    assert overall["problems"] == {} and overall["failed"] == 0
    # The other family's grammar is caught: the audit fails (exit 3) and says by how much.
    other = "qwen3" if family_name == "kimi-k2.5" else "kimi-k2.5"
    res = run_cli("audit", str(out), "--family", other)
    assert res.returncode == 3 and "audit failed: mean abs diff" in res.stdout


def test_a_wrong_tokenizer_fails_the_audit(tmp_path: Path) -> None:
    out = _run(tmp_path, "moonshotai/kimi-k2.5", extra='[reconstruct]\nfamily = "kimi-k2.5"\n')
    assert run_cli("audit", str(out)).returncode == 0  # the job's [reconstruct] is used
    # A byte-level tokenizer without the sim's merges: every count is off.
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|im_end|>", "</think>", "<think>"])
    tok.save(str(tmp_path / "bytes.json"))
    template = tmp_path / "kimi.jinja"
    from regen.reconstruct import sim_template

    template.write_text(sim_template("kimi-k2.5"))
    res = run_cli(
        "audit",
        str(out),
        "--tokenizer",
        str(tmp_path / "bytes.json"),
        "--chat-template",
        str(template),
        "--json",
    )
    assert res.returncode == 3
    data = json.loads(res.stdout)
    assert data["overall"]["mean_abs_diff"] > 10 and data["overall"]["match_share"] < 0.1
    assert any("mean abs diff" in b for b in data["broken"])


def test_kimi_layout_of_reasoning_content_and_a_tool_call() -> None:
    target = Target(TargetSpec(family="kimi-k2.5"))
    calls = [
        {
            "id": "functions.lookup:0",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "x"}'},
        }
    ]
    k25 = family("kimi-k2.5").layout
    # The prompt pre-fills `<think>` (`<think></think>` with thinking off).
    text = k25(Answer("think", "ok", calls, truncated=False, thinking=True, prefill="<think>"))
    assert text == (
        "think</think>ok<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
        '<|tool_call_argument_begin|>{"q": "x"}<|tool_call_end|><|tool_calls_section_end|>'
        "<|im_end|>"
    )
    [ids] = target.encode_batch([text])
    assert target.decode(ids) == text
    cut = Answer("thinking stopped", "", [], truncated=True, thinking=True, prefill="<think>")
    assert k25(cut) == "thinking stopped"
    off = Answer("", "hi", [], truncated=False, thinking=False, prefill="<think></think>")
    assert k25(off) == "hi<|im_end|>"


def _row(content: str, calls: list[dict], tools: list[dict], **kw: object) -> ExportRow:
    return ExportRow(
        item_id="x",
        turn_index=1,
        conversation={"messages": [{"role": "user", "content": "q"}], "tools": tools},
        content=content,
        reasoning=kw.get("reasoning"),  # type: ignore[arg-type]
        tool_calls=calls,
        finish_reason=kw.get("finish", "stop"),  # type: ignore[arg-type]
        provider=kw.get("provider"),  # type: ignore[arg-type]
    )


def test_structural_checks() -> None:
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    }
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]
    markers = family("kimi-k2.5").markers
    checks = Checks(expect_reasoning=True, excluded_providers=frozenset({"Bad"}))
    bad_calls = [
        {"function": {"name": "other", "arguments": "{}"}},
        {"function": {"name": "lookup", "arguments": "{oops"}},
        {"function": {"name": "lookup", "arguments": '{"q": 3}'}},
    ]
    row = _row("a </think> b", bad_calls, tools, finish="weird", provider="Bad")
    assert structure(row, markers, checks) == [
        "no_reasoning",
        "marker_in_content",
        "undeclared_tool",
        "arguments_not_json",
        "arguments_off_schema",
        "finish_weird",
        "excluded_provider",
    ]
    good = [{"function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    assert (
        structure(_row("", good, tools, reasoning="r", finish="tool_calls"), markers, checks) == []
    )
    assert structure(
        _row("fine", [], tools, reasoning="r", finish="tool_calls"), markers, checks
    ) == ["tool_calls_finish_without_calls"]
    # A tool whose declared schema is itself invalid does not fail the answer.
    loose = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": 7}}}]
    assert structure(_row("", good, loose, reasoning="r"), markers, checks) == []


def test_an_unknown_family_or_tokenizer_is_one_line(tmp_path: Path) -> None:
    out = _run(tmp_path, "moonshotai/kimi-k2.5")
    for flags in (
        ["--family", "kimi-k2.5", "--tokenizer", str(tmp_path / "nope.json")],
        ["--family", "kimi-9"],
        [],
    ):
        res = run_cli("audit", str(out), *flags)
        assert res.returncode == 1 and res.stderr.startswith("error: "), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_the_run_audits_as_it_goes_and_status_flags_drift(tmp_path: Path) -> None:
    right = tmp_path / "right"
    right.mkdir()
    out = _run(right, "moonshotai/kimi-k2.5", extra='[reconstruct]\nfamily = "kimi-k2.5"\n')
    res = run_cli("status", str(out), "--json")
    live = json.loads(res.stdout)["live_audit"]
    assert live["family"] == "kimi-k2.5" and live["checked"] >= 20
    assert live["failed"] == 0 and live["mean_abs_diff"] == 0.0
    assert "live audit (kimi-k2.5)" in run_cli("status", str(out)).stdout
    # The wrong family: every sample drifts; the run says so, finishes, and status shows it.
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    out = _run(wrong, "moonshotai/kimi-k2.5", extra='[reconstruct]\nfamily = "qwen3"\n')
    log = (out / "run.log").read_text()
    assert "audit: chat item " in log and "length_off_billed" in log
    live = json.loads(run_cli("status", str(out), "--json").stdout)["live_audit"]
    assert live["failed"] == live["checked"] > 0 and live["recent_drifts"]
    text = run_cli("status", str(out)).stdout
    assert "failing" in text and "billed" in text


def test_a_live_audit_that_cannot_start_leaves_the_run_alone(tmp_path: Path) -> None:
    extra = '[reconstruct]\nfamily = "kimi-k2.5"\ntokenizer = "./no/such/tokenizer.json"\n'
    out = _run(tmp_path, "moonshotai/kimi-k2.5", extra=extra)  # asserts exit 0
    assert "live audit off: tokenizer" in (out / "run.log").read_text()


def test_a_tokenizer_folder_with_its_own_chat_template(tmp_path: Path) -> None:
    from importlib import resources

    from regen.reconstruct import sim_template

    out = _run(tmp_path, "moonshotai/kimi-k2.5")
    folder = tmp_path / "kimi-tok"  # tokenizer.json and tokenizer_config.json, as on the hub
    shutil.copytree(str(resources.files("regen.sim").joinpath("tokenizer")), folder)
    shutil.rmtree(folder / "templates")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    # Without a chat template: one line that says what to give.
    res = run_cli("audit", str(out), "--family", "kimi-k2.5", "--tokenizer", str(folder))
    assert res.returncode == 1 and "has no chat template" in res.stderr
    config["chat_template"] = sim_template("kimi-k2.5")
    folder = folder.rename(tmp_path / "kimi-tok-templated")  # a new tokenizer, not a cached one
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    res = run_cli("audit", str(out), "--family", "kimi-k2.5", "--tokenizer", str(folder), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    overall = json.loads(res.stdout)["overall"]
    assert overall["match_share"] == 1.0 and overall["prompt_match_share"] == 1.0


def test_export_drops_samples_that_fail_the_audit(tmp_path: Path) -> None:
    out = _run(tmp_path, "moonshotai/kimi-k2.5", extra='[reconstruct]\nfamily = "kimi-k2.5"\n')

    def dropped(*flags: str) -> dict[str, int]:
        res = run_cli("export", str(out), "--drop-failed-audit", *flags)
        assert res.returncode == 0, res.stdout + res.stderr
        manifest = json.loads((out / "export" / "specforge" / "manifest.json").read_text())
        assert manifest["filters"]["drop_failed_audit"] is True
        return manifest["datasets"]["chat"]["dropped"]

    assert "failed_audit" not in dropped()
    # Rebuilt in the wrong grammar, every answer is off the bill and fails.
    assert dropped("--family", "qwen3").get("failed_audit", 0) >= 30
