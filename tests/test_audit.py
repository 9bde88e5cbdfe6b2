"""`regen audit`: completions rebuilt in the family's grammar match what the simulator billed
(its grammar is its own code), a wrong family is caught, and structural checks find what they
say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from regen.audit import _structure
from regen.reconstruct import completion_ids, load_tokenizer
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import run_cli, write_job, write_rows

FIXTURES = Path(__file__).parent / "sources" / "fixtures"


@pytest.mark.parametrize(
    ("model", "family"), [("moonshotai/kimi-k2.5", "kimi-k2.5"), ("qwen/qwen3-8b", "qwen3")]
)
def test_reconstructed_completions_match_the_billed_tokens(
    tmp_path: Path, model: str, family: str
) -> None:
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
        )
        job.write_text(
            job.read_text()
            .replace("moonshotai/kimi-k2.5", model)
            .replace("max_tokens = 512", "max_tokens = 2000")
        )
        assert run_cli("run", str(job)).returncode == 0
    res = run_cli("audit", str(tmp_path / "out"), "--family", family, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    overall = json.loads(res.stdout)["overall"]
    assert overall["samples"] >= 40
    assert overall["mean_abs_diff"] == 0.0 and overall["match_share"] == 1.0
    assert overall["problems"] == {}
    # The other family's grammar is caught: the audit fails (exit 3) and says by how much.
    other = "qwen3" if family == "kimi-k2.5" else "kimi-k2.5"
    res = run_cli("audit", str(tmp_path / "out"), "--family", other)
    assert res.returncode == 3 and "audit failed: mean abs diff" in res.stdout


def test_kimi_layout_of_reasoning_content_and_a_tool_call() -> None:
    tok = load_tokenizer("sim")
    calls = [
        {
            "id": "functions.lookup:0",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "x"}'},
        }
    ]
    ids = completion_ids(tok, "kimi-k2.5", "think", "ok", calls, "tool_calls")
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == (
        "think</think>ok<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
        '<|tool_call_argument_begin|>{"q": "x"}<|tool_call_end|><|tool_calls_section_end|>'
        "<|im_end|>"
    )
    cut = completion_ids(tok, "kimi-k2.5", "thinking stopped", "", [], "length")
    assert tok.decode(cut, skip_special_tokens=False) == "thinking stopped"


def test_structural_checks() -> None:
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    bad_call = [{"function": {"name": "other", "arguments": "{oops"}}]
    assert _structure(None, "a </think> b", bad_call, tools, True, "stop") == [
        "no_reasoning",
        "stray_marker_in_content",
        "undeclared_tool",
        "arguments_not_json",
    ]
    assert _structure("r", "fine", [], tools, True, "stop") == []


def test_an_unknown_family_or_tokenizer_is_one_line(tmp_path: Path) -> None:
    res = run_cli(
        "audit", str(tmp_path), "--family", "kimi-k2.5", "--tokenizer", str(tmp_path / "nope.json")
    )
    assert res.returncode == 1 and res.stderr.startswith("error: ")
