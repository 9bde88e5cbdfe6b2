"""`regen export`: each format round-trips against state.db; filters, mixes, splits, dedup,
the manifest and incremental parts do what they say."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from regen.conversation import Attempt, Message, Outcome, Result, ToolCall, Usage
from regen.errors import StateError
from regen.outputs.export import ExportOptions, export_job
from regen.reconstruct import Target, TargetSpec
from regen.sim import SimConfig, sim_in_thread
from regen.state.db import Store
from tests.conftest import chat_rows, query, run_cli, write_job, write_rows
from tests.hub_api import patch_public_hub
from tests.hub_standin import (
    IGNORE_HTTPX_DATA_DEPRECATION,
    PLAYED_CLIENT,
    hub_standin_in_thread,
    isolate_hub_client,
)

ITEM_ROWS = (
    "SELECT i.id, c.row_index, i.turn_index FROM items i "
    "JOIN conversations c ON c.id = i.conversation_id"
)
PROVENANCE_FIELDS = {
    "source_file",
    "source_row",
    "source_id",
    "mode",
    "turn_index",
    "sample",
    "history",
    "item_id",
    "model",
    "provider",
    "endpoint",
    "run_id",
    "generation_id",
    "settings",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "usage_source",
    "token_ids",
}


@pytest.fixture(scope="module")
def job_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished job with two datasets, one with tool calls (answers from the simulator)."""
    tmp = tmp_path_factory.mktemp("job")
    write_rows(tmp / "a.jsonl", chat_rows(40, "Alpha"))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": f"Find fact {i}"},
            ],
            "tools": tools,
        }
        for i in range(20)
    ] + [{"messages": [{"role": "user", "content": "Find fact 0"}]}] * 0
    write_rows(tmp / "b.jsonl", rows)
    with sim_in_thread(SimConfig(seed=8, time_scale=0.0)) as sim:
        job = write_job(
            tmp, sim.base_url, datasets=[("a", "a.jsonl", "openai"), ("b", "b.jsonl", "openai")]
        )
        assert run_cli("run", str(job)).returncode == 0
    return tmp / "out"


SPECFORGE_FIELDS = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name"}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def export(out: Path, to: Path, *args: str) -> dict[str, Any]:
    res = run_cli("export", str(out), "--to", str(to), *args)
    assert res.returncode == 0, res.stderr
    return json.loads((to / "manifest.json").read_text())


def test_specforge_and_openai_round_trip_against_state_db(job_out: Path, tmp_path: Path) -> None:
    manifest = export(job_out, tmp_path / "sf", "--format", "specforge", "--keep-truncated")
    db = {
        item: (content, reasoning, calls)
        for item, content, reasoning, calls in query(
            job_out, "SELECT item_id, content, reasoning, tool_calls FROM results"
        )
    }
    train = tmp_path / "sf" / "train"
    recs = lines(train / "a.jsonl") + lines(train / "b.jsonl")
    assert len(recs) == len(db) == 60
    for rec in recs:
        assert set(rec) <= {"id", "conversations", "tools", "provenance", "input_ids", "loss_mask"}
        assert rec["provenance"]["item_id"] == rec["id"]
        assert rec["provenance"]["history"] == "none"  # single-turn rows
        assert json.loads(rec["provenance"]["settings"])["model"]
        last = rec["conversations"][-1]
        content, reasoning, calls = db[rec["id"]]
        assert last["role"] == "assistant" and last["content"] == content
        assert last.get("reasoning_content") == reasoning
        assert last.get("tool_calls", None) == (json.loads(calls) if calls else None)
        for m in rec["conversations"]:
            assert set(m) <= SPECFORGE_FIELDS
    assert all("tools" in r for r in lines(tmp_path / "sf" / "train" / "b.jsonl"))
    assert manifest["datasets"]["a"]["samples"] == {"train": 40, "validation": 0}
    (fingerprint,) = query(job_out, "SELECT value FROM meta WHERE key = 'fingerprint'")[0]
    assert manifest["fingerprint"] == fingerprint
    assert manifest["regen_version"] and manifest["filters"]["format"] == "specforge"
    oa = export(job_out, tmp_path / "oa", "--format", "openai", "--keep-truncated")
    first = lines(tmp_path / "oa" / "train" / "a.jsonl")[0]
    assert set(first) == {"id", "messages", "provenance"}
    assert first["messages"][-1]["role"] == "assistant" and first["messages"][-1]["weight"] == 1
    assert oa["datasets"]["b"]["completion_tokens"] == sum(
        n for (n,) in query(job_out, "SELECT completion_tokens FROM results WHERE dataset = 'b'")
    )


def test_sharegpt_marks_calls_and_reasoning(job_out: Path, tmp_path: Path) -> None:
    export(job_out, tmp_path / "sg", "--format", "sharegpt", "--keep-truncated")
    recs = lines(tmp_path / "sg" / "train" / "b.jsonl")
    assert all(r["system"] == "Use tools." for r in recs)
    assert all(r["conversations"][0]["from"] == "human" for r in recs)
    froms = {t["from"] for r in recs for t in r["conversations"]}
    assert froms <= {"human", "gpt", "function_call", "observation"}
    calls = [t for r in recs for t in r["conversations"] if t["from"] == "function_call"]
    assert calls
    for t in calls:
        # One turn per assistant turn: reasoning inline, then the call with its arguments as an
        # object (LLaMA-Factory json.dumps them again: a string would be encoded twice).
        call = json.loads(t["value"].rpartition("</think>\n\n")[2])
        assert call["name"] == "lookup" and isinstance(call["arguments"], dict)
    for r in recs:  # turns alternate as LLaMA-Factory's sharegpt converter requires
        kinds = [t["from"] in ("gpt", "function_call") for t in r["conversations"]]
        assert kinds == [k % 2 == 1 for k in range(len(kinds))]
    reasoned = [
        t
        for r in lines(tmp_path / "sg" / "train" / "a.jsonl")
        for t in r["conversations"]
        if t["value"].startswith("<think>\n")
    ]
    assert reasoned  # the simulated Kimi reasons: its reasoning is inline
    # Every row carries system and tools (LLaMA-Factory refuses a file without the column).
    assert all(r["system"] == "" and r["tools"] == "" for r in lines(tmp_path / "sg/train/a.jsonl"))


def test_filters_split_mix_and_dedup(job_out: Path, tmp_path: Path) -> None:
    truncated = query(job_out, "SELECT COUNT(*) FROM results WHERE finish_reason = 'length'")[0][0]
    m = export(job_out, tmp_path / "f", "--min-tokens", "200")
    short = query(
        job_out,
        "SELECT COUNT(*) FROM results WHERE completion_tokens < 200 AND finish_reason != 'length'",
    )[0][0]
    dropped: dict[str, int] = {}
    for d in m["datasets"].values():
        for k, v in d["dropped"].items():
            dropped[k] = dropped.get(k, 0) + v
    assert dropped.get("truncated", 0) == truncated
    assert dropped.get("below_min_tokens", 0) == short
    m = export(job_out, tmp_path / "s", "--validation", "0.25", "--seed", "3", "--keep-truncated")
    a = m["datasets"]["a"]["samples"]
    assert a["train"] + a["validation"] == 40 and 3 <= a["validation"] <= 20
    val_ids = {r["id"] for r in lines(tmp_path / "s" / "validation" / "a.jsonl")}
    train_ids = {r["id"] for r in lines(tmp_path / "s" / "train" / "a.jsonl")}
    assert not val_ids & train_ids
    again = export(
        job_out, tmp_path / "s2", "--validation", "0.25", "--seed", "3", "--keep-truncated"
    )
    assert again["datasets"] == m["datasets"]  # seeded: the same split
    m = export(
        job_out,
        tmp_path / "w",
        "--weight",
        "a=2",
        "--weight",
        "b=0.5",
        "--cap",
        "a=50",
        "--keep-truncated",
    )
    assert m["datasets"]["a"]["samples"]["train"] == 50
    assert m["datasets"]["a"]["dropped"]["cap"] == 15  # source rows left out
    assert 3 <= m["datasets"]["b"]["samples"]["train"] <= 17
    m = export(job_out, tmp_path / "d", "--weight", "a=2", "--dedup", "--keep-truncated")
    assert m["datasets"]["a"]["samples"]["train"] == 80  # copies made by the weight stay
    res = run_cli("export", str(job_out), "--cap", "zzz=3")
    assert res.returncode == 2 and "no dataset zzz" in res.stderr
    res = run_cli("export", str(job_out), "--weight", "a")
    assert res.returncode == 2 and "--weight takes DATASET=FLOAT" in res.stderr


def add_answer(store: Store, item_id: str, n: int, ids: bool) -> None:
    msg = Message("assistant", f"answer {n}")
    r = Result(
        item_id,
        msg,
        "stop",
        Usage(3, 2, 0, 0.001),
        provider="P",
        prompt_token_ids=(1, 2, 3) if ids else None,
        completion_token_ids=(7, 8) if ids else None,
    )
    attempt = Attempt(1, time.time(), 0.1, 200)
    store.commit_outcomes([Outcome(item_id, "chat", (attempt,), result=r)])


def test_tokenized_parquet_loads_with_datasets_and_incremental_parts(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    job = write_job(tmp_path, "http://127.0.0.1:9/v1", rows=30)
    from regen.config import load_job
    from regen.sources.ingest import ingest

    store = Store.open(load_job(job).output_path)
    ingest(store, load_job(job))
    items = [i for (i,) in query(tmp_path / "out", "SELECT id FROM items ORDER BY order_key")]
    for n, item in enumerate(items[:20]):
        add_answer(store, item, n, ids=n % 4 != 0)
    to = tmp_path / "tok"
    # Without a template family, an answer without exact ids stops the export (nothing is
    # written), rather than being left out unseen.
    with pytest.raises(StateError, match="has no exact token ids: give --family"):
        export_job(store, ["chat"], to, ExportOptions(format="tokenized", shard_rows=6))
    assert not to.exists()
    target = Target(TargetSpec(family="chatml", thinking=False))
    opts = ExportOptions(format="tokenized", shard_rows=6)
    m = export_job(store, ["chat"], to, opts, target)
    assert m["datasets"]["chat"]["samples"]["train"] == 20
    assert m["datasets"]["chat"]["ids"] == {"exact": 15, "reconstructed": 5}
    assert m["reconstruct"]["family"] == "chatml"
    files = sorted((to / "train").glob("chat-*.parquet"))
    assert len(files) == 4  # 20 rows, 6 a shard
    ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    assert ds.num_rows == 20
    rebuilt = next(r for r in ds if r["source"] == "reconstructed")
    n_prompt = rebuilt["n_prompt"]
    assert rebuilt["loss_mask"] == [0] * n_prompt + [1] * rebuilt["n_completion"]
    answer = target.decode(rebuilt["input_ids"][n_prompt:])
    assert answer.startswith("answer ") and answer.endswith("<|im_end|>")
    prompt = target.decode(rebuilt["input_ids"][:n_prompt])
    # Qwen2.5's published template (the chatml family's) adds its default system prompt.
    assert prompt.startswith("<|im_start|>system\nYou are Qwen") and "<|im_start|>user\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    row = next(r for r in ds if r["source"] == "exact")
    assert row["input_ids"] == [1, 2, 3, 7, 8] and row["loss_mask"] == [0, 0, 0, 1, 1]
    assert (row["prompt_diff"], row["completion_diff"]) == (0, 0)  # billed 3 and 2
    assert (row["n_prompt"], row["n_completion"], row["source"]) == (3, 2, "exact")
    assert set(ds.column_names) == {
        "id",
        "dataset",
        "input_ids",
        "loss_mask",
        "n_prompt",
        "n_completion",
        "source",
        "prompt_diff",
        "completion_diff",
        *PROVENANCE_FIELDS,
    }
    # Each row joins back to its source row, and says how its ids were made.
    rows = {i: (row, turn) for i, row, turn in query(tmp_path / "out", ITEM_ROWS)}
    for r in ds:
        assert rows[r["id"]] == (r["source_row"], r["turn_index"])
        assert r["token_ids"] == r["source"] and r["mode"] == "last_turn"
        assert r["source_file"].endswith("chat.jsonl") and r["history"] == "none"
        assert (r["provider"], r["finish_reason"], r["cost_usd"]) == ("P", "stop", 0.001)
    # Incremental: only what came after the last export, as a new part; nothing twice.
    time.sleep(0.01)
    for n, item in enumerate(items[20:], start=20):
        add_answer(store, item, n, ids=True)
    m2 = export_job(store, ["chat"], to, ExportOptions(format="tokenized", since_last=True))
    assert m2["datasets"]["chat"]["ids"] == {"exact": 10}
    assert m2["part"] == 1 and m2["datasets"]["chat"]["samples"]["train"] == 10
    part = datasets.load_dataset(
        "parquet",
        data_files=[str(f) for f in (to / "train").glob("chat.part0001-*.parquet")],
        split="train",
    )
    assert part.num_rows == 10 and not set(part["id"]) & set(ds["id"])
    assert [p["part"] for p in m2["parts"]] == [0, 1]
    with pytest.raises(Exception, match="no earlier specforge export"):
        export_job(store, ["chat"], tmp_path / "none", ExportOptions(since_last=True))
    store.close()


def test_a_failed_export_leaves_the_previous_one_whole(job_out: Path, tmp_path: Path) -> None:
    import os
    import resource
    import subprocess
    import sys

    to = tmp_path / "x"
    export(job_out, to, "--keep-truncated")
    before = {p: p.read_bytes() for p in to.rglob("*") if p.is_file()}
    # No file may grow past 33 kB: state.db's shared-memory file (32 kB) still fits, the
    # export's first file does not (EFBIG, as a full disk gives ENOSPC).
    cap = 33_000
    assert (to / "train" / "a.jsonl").stat().st_size > cap

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "regen",
            "export",
            str(job_out),
            "--to",
            str(to),
            "--format",
            "openai",
        ],
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
        timeout=60,
        env=os.environ,
    )
    assert res.returncode == 1
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {to}: cannot write the export: ")
    assert {p: p.read_bytes() for p in to.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no temporary folder left


def multi_turn_store(tmp_path: Path) -> tuple[Store, list[str]]:
    """A last_turn dataset of OpenAI batch lines whose history holds the dataset's own answer,
    each answered (as a run would store it) by a tool call and with exact ids."""
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [
                    {"role": "user", "content": f"Hi {i}"},
                    {"role": "assistant", "content": f"SOURCE ANSWER {i}"},
                    {"role": "user", "content": f"Weather in city {i}?"},
                ],
                "tools": [{"type": "function", "function": {"name": "weather"}}],
            },
        }
        for i in range(6)
    ]
    write_rows(tmp_path / "batch.jsonl", rows)
    job = write_job(
        tmp_path, "http://127.0.0.1:9/v1", datasets=[("chat", "batch.jsonl", "openai_batch")]
    )
    from regen.config import load_job
    from regen.sources.ingest import ingest

    store = Store.open(load_job(job).output_path)
    ingest(store, load_job(job))
    items = [i for (i,) in query(tmp_path / "out", "SELECT id FROM items ORDER BY order_key")]
    for n, item in enumerate(items):
        call = ToolCall(f"c{n}", "weather", json.dumps({"city": n}))
        r = Result(
            item,
            Message("assistant", "", reasoning=f"think {n}", tool_calls=(call,)),
            "tool_calls",
            Usage(9, 4, 2, 0.002),
            provider="P",
            model="m",
            prompt_token_ids=(1, 2, 3),
            completion_token_ids=(7, 8),
            settings='{"model":"m","temperature":0.7}',
        )
        store.commit_outcomes([Outcome(item, "chat", (Attempt(1, time.time(), 0.1, 200),), r)])
    return store, items


def test_only_the_targets_text_is_trainable_by_default(tmp_path: Path) -> None:
    store, items = multi_turn_store(tmp_path)
    # OpenAI: the dataset's own answer stays as context with weight 0; the target's has 1.
    m = export_job(store, ["chat"], tmp_path / "oa", ExportOptions(format="openai"))
    recs = [json.loads(x) for x in (tmp_path / "oa/train/chat.jsonl").read_text().splitlines()]
    assert len(recs) == m["datasets"]["chat"]["samples"]["train"] == 6
    for rec in recs:
        weights = [(x["content"], x.get("weight")) for x in rec["messages"] if "weight" in x]
        assert weights[0][0].startswith("SOURCE ANSWER") and weights[0][1] == 0
        assert weights[-1][1] == 1 and rec["messages"][-1]["tool_calls"]
        p = rec["provenance"]
        # Joined back to the batch line by its custom_id; the settings are what was sent.
        n = int(p["source_id"].removeprefix("req-"))
        assert p["source_row"] == n and rec["messages"][0]["content"] == f"Hi {n}"
        assert p["history"] == "source" and p["mode"] == "last_turn" and p["turn_index"] == 3
        assert json.loads(p["settings"]) == {"model": "m", "temperature": 0.7}
        assert (p["reasoning_tokens"], p["token_ids"], p["model"]) == (2, "exact", "m")
    # ShareGPT: LLaMA-Factory trains every gpt turn, so those samples are left out by default.
    m = export_job(store, ["chat"], tmp_path / "sg", ExportOptions(format="sharegpt"))
    assert m["datasets"]["chat"]["dropped"] == {"source_history": 6}
    m = export_job(
        store, ["chat"], tmp_path / "sg2", ExportOptions(format="sharegpt", train_source_turns=True)
    )
    assert m["datasets"]["chat"]["samples"]["train"] == 6
    rec = json.loads((tmp_path / "sg2/train/chat.jsonl").read_text().splitlines()[0])
    assert [t["from"] for t in rec["conversations"]] == ["human", "gpt", "human", "function_call"]
    call = json.loads(rec["conversations"][-1]["value"].rpartition("</think>\n\n")[2])
    assert isinstance(call["arguments"], dict) and json.loads(rec["tools"])[0]["function"]
    # SpecForge without the target's ids: left out; with them, pre-tokenized (exact mask).
    m = export_job(store, ["chat"], tmp_path / "sf", ExportOptions(format="specforge"))
    assert m["datasets"]["chat"]["dropped"] == {"source_history": 6}
    target = Target(TargetSpec(family="chatml", thinking=False))
    m = export_job(store, ["chat"], tmp_path / "sf2", ExportOptions(format="specforge"), target)
    assert m["datasets"]["chat"]["samples"]["train"] == 6
    for line in (tmp_path / "sf2/train/chat.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert rec["input_ids"] == [1, 2, 3, 7, 8] and rec["loss_mask"] == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("fmt", ["specforge", "openai", "sharegpt", "tokenized"])
def test_every_export_folder_loads_with_load_dataset_and_no_arguments(
    job_out: Path, tmp_path: Path, fmt: str
) -> None:
    datasets = pytest.importorskip("datasets")
    to = tmp_path / fmt
    ids = ["--family", "kimi-k2.5"] if fmt == "tokenized" else []
    m = export(job_out, to, "--format", fmt, "--keep-truncated", "--validation", "0.2", *ids)
    loaded = datasets.load_dataset(str(to))  # the card's default config: the first dataset
    assert set(loaded) == {"train", "validation"}
    assert loaded["train"].num_rows == m["datasets"]["a"]["samples"]["train"]
    b = datasets.load_dataset(str(to), "b")
    assert b["train"].num_rows + b["validation"].num_rows == sum(
        m["datasets"]["b"]["samples"].values()
    )
    card = (to / "README.md").read_text()
    assert "# Answers regenerated with moonshotai/kimi-k2.5" in card
    assert "Only text the target wrote." in card and "`temperature`" not in card
    assert '"temperature":0.7' in card  # the settings the requests carried
    if fmt == "sharegpt":
        info = json.loads((to / "dataset_info.json").read_text())
        assert (
            info["a"]["file_name"] == "train/a.jsonl"
            and info["b_validation"]["formatting"] == "sharegpt"
        )


def test_push_to_hub_uploads_the_export_folder(
    job_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At huggingface_hub's public API (HfApi's create_repo and upload_folder, tests/hub_api.py):
    the export folder as it was written, and a refused token as one line."""
    to = tmp_path / "tok"
    hub = patch_public_hub(monkeypatch, "hf_secret")
    env = {"HF_ENDPOINT": "http://hub.test", "HF_TOKEN": "hf_secret"}
    res = run_cli(
        "export", str(job_out), "--to", str(to), "--format", "tokenized",
        "--family", "kimi-k2.5", "--push-to-hub", "me/regen-out", env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "uploaded to the Hub" in res.stdout and "datasets/me/regen-out/commit/" in res.stdout
    sent = hub.files["me/regen-out"]
    assert sent == {
        p.relative_to(to).as_posix(): p.read_bytes() for p in to.rglob("*") if p.is_file()
    }
    assert any(f.endswith(".parquet") for f in sent) and "README.md" in sent
    assert hub.repos["me/regen-out"]["repo_type"] == "dataset"
    res = run_cli(
        "export", str(job_out), "--to", str(to), "--format", "openai",
        "--push-to-hub", "me/regen-out", env={**env, "HF_TOKEN": "hf_wrong"},
    )  # fmt: skip
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "cannot upload" in res.stderr and "HTTP 401" in res.stderr
    assert "hf_wrong" not in res.stderr and res.stderr.count("\n") == 1
    assert (to / "README.md").exists()


@PLAYED_CLIENT
@pytest.mark.filterwarnings(IGNORE_HTTPX_DATA_DEPRECATION)
def test_push_to_hub_end_to_end_on_the_hub_standin(
    job_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real client against a local stand-in of the Hub's upload endpoints
    (tests/hub_standin.py), for the client versions it plays: the real Hub was not used here."""
    from huggingface_hub.utils import close_session

    isolate_hub_client(monkeypatch, tmp_path)
    to = tmp_path / "tok"
    try:
        with hub_standin_in_thread("hf_secret") as hub:
            env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_secret"}
            res = run_cli(
                "export", str(job_out), "--to", str(to), "--format", "tokenized",
                "--family", "kimi-k2.5", "--push-to-hub", "me/regen-out", env=env,
            )  # fmt: skip
            assert res.returncode == 0, res.stderr
            assert "uploaded to the Hub" in res.stdout
            sent = hub.files["me/regen-out"]
            assert sent == {
                p.relative_to(to).as_posix(): p.read_bytes() for p in to.rglob("*") if p.is_file()
            }
            assert any(f.endswith(".parquet") for f in sent) and "README.md" in sent
            # A token the Hub refuses: one line, the folder kept, no traceback.
            res = run_cli(
                "export", str(job_out), "--to", str(to), "--format", "openai",
                "--push-to-hub", "me/regen-out", env={**env, "HF_TOKEN": "hf_wrong"},
            )  # fmt: skip
            assert res.returncode != 0 and "Traceback" not in res.stderr
            assert "cannot upload" in res.stderr and "HTTP 401" in res.stderr
            assert "hf_wrong" not in res.stderr
            assert (to / "README.md").exists()
    finally:
        close_session()


def test_an_export_that_keeps_cut_answers_says_how_many_and_how_checked(
    job_out: Path, tmp_path: Path
) -> None:
    """Issue 48: `--keep-truncated` exported cut answers with no word of them; the export now
    counts them, and how many the self-check rebuilt whole (none without a target)."""
    ((cut,),) = query(job_out, "SELECT COUNT(*) FROM results WHERE finish_reason = 'length'")
    assert cut > 0  # the fixture's job has answers cut at max_tokens
    res = run_cli("export", str(job_out), "--to", str(tmp_path / "k"), "--keep-truncated")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    kept = [d["truncated"] for d in manifest["datasets"].values()]
    assert sum(t["kept"] for t in kept) == cut and sum(t["checked_whole"] for t in kept) == 0
    said = [n for n in manifest["notes"] if "cut at max_tokens kept" in n]
    assert said == [
        f"export: {cut} answer(s) cut at max_tokens kept (--keep-truncated); 0 of them rebuilt "
        f"and checked whole against the target's template, {cut} not (no target to check "
        "them: give --family or the job's [reconstruct]; or text the template does not show: "
        "`regen audit` names them)"
    ]
    assert said[0][:40] in res.stdout
    dropped = export(job_out, tmp_path / "d")
    assert all(d["truncated"]["kept"] == 0 for d in dropped["datasets"].values())
    assert not any("cut at max_tokens" in n for n in dropped["notes"])
