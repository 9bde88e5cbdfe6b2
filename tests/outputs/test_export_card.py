"""The export's card and manifest are built from what the exporter wrote (issue 48): each
file filed under its own dataset and split, whatever the dataset's name (a dash, a dot), over
incremental parts; and no absolute local path in any file meant for upload."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from regen.config import load_job
from regen.conversation import Attempt, Message, Outcome, Result, Usage
from regen.errors import StateError
from regen.outputs.export import ExportOptions, export_job
from regen.reconstruct import Target, TargetSpec, sim_template
from regen.sim import SimConfig, sim_in_thread
from regen.sources.ingest import ingest
from regen.state.db import Store
from tests.conftest import chat_rows, query, run_cli, write_job, write_rows

NAMES = ("code-python", "v1.5", "my.particle")
SIM_TOKENIZER = Path(__file__).parents[2] / "src/regen/sim/tokenizer/tokenizer.json"


def add_answer(store: Store, dataset: str, item_id: str, n: int) -> None:
    """An answer with the server's ids (exported as they are)."""
    r = Result(
        item_id,
        Message("assistant", f"answer {n}"),
        "stop",
        Usage(3, 2, 0, 0.001),
        prompt_token_ids=(1, 2, 3),
        completion_token_ids=(7, 8),
    )
    attempt = Attempt(1, time.time(), 0.1, 200)
    store.commit_outcomes([Outcome(item_id, dataset, (attempt,), result=r)])


def answered_store(tmp_path: Path) -> tuple[Store, dict[str, list[str]]]:
    """Three datasets of 10 prompts with awkward names; items not yet answered, by dataset."""
    for name in NAMES:
        write_rows(tmp_path / f"{name}.jsonl", chat_rows(10))
    job = write_job(
        tmp_path,
        "http://127.0.0.1:9/v1",
        datasets=[(name, f"{name}.jsonl", "openai") for name in NAMES],
    )
    store = Store.open(load_job(job).output_path)
    ingest(store, load_job(job))
    items: dict[str, list[str]] = {}
    for item, ds in query(tmp_path / "out", "SELECT id, dataset FROM items ORDER BY order_key"):
        items.setdefault(ds, []).append(item)
    return store, items


def local_target(tmp_path: Path) -> Target:
    """A target whose tokenizer and template are local files, given by absolute paths."""
    tokenizer = tmp_path / "models" / "tok.json"
    tokenizer.parent.mkdir()
    shutil.copy(SIM_TOKENIZER, tokenizer)
    template = tmp_path / "models" / "chatml.jinja"
    template.write_text(sim_template("chatml"))
    spec = TargetSpec(
        family="chatml",
        tokenizer=str(tokenizer.resolve()),
        chat_template=str(template.resolve()),
        thinking=False,
    )
    return Target(spec)


def test_the_card_files_each_part_under_its_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    store, items = answered_store(tmp_path)
    for ds in NAMES:
        for n, item in enumerate(items[ds][:6]):
            add_answer(store, ds, item, n)
    target = local_target(tmp_path)
    to = tmp_path / "export"
    export_job(store, list(NAMES), to, ExportOptions(format="tokenized", shard_rows=4), target)
    time.sleep(0.01)
    for ds in NAMES:
        for n, item in enumerate(items[ds][6:], start=6):
            add_answer(store, ds, item, n)
    opts = ExportOptions(format="tokenized", shard_rows=4, since_last=True)
    export_job(store, list(NAMES), to, opts, target)
    for ds in NAMES:  # both parts of each dataset, and nothing of another
        loaded = datasets.load_dataset(str(to), ds, split="train")
        assert loaded.num_rows == 10 and set(loaded["dataset"]) == {ds}


def test_no_uploaded_file_names_a_local_path(tmp_path: Path) -> None:
    store, items = answered_store(tmp_path)
    for n, item in enumerate(items["v1.5"]):
        add_answer(store, "v1.5", item, n)
    to = tmp_path / "export"
    export_job(store, ["v1.5"], to, ExportOptions(format="tokenized"), local_target(tmp_path))
    for f in to.rglob("*"):
        if f.is_file() and f.suffix in (".md", ".json"):
            text = f.read_text()
            assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, f.name
    assert "`tok.json`" in (to / "README.md").read_text()


def test_specforge_without_ids_says_which_template_keeps_the_reasoning(tmp_path: Path) -> None:
    store, items = answered_store(tmp_path)
    for n, item in enumerate(items["v1.5"]):
        r = Result(
            item,
            Message("assistant", f"answer {n}", reasoning=f"thinking {n}"),
            "stop",
            Usage(3, 9, 7, 0.001),
        )
        store.commit_outcomes([Outcome(item, "v1.5", (Attempt(1, time.time(), 0.1, 200),), r)])
    store.close()
    res = run_cli("export", str(tmp_path / "out"), "--format", "specforge")
    assert res.returncode == 0, res.stdout + res.stderr
    said = [line for line in res.stdout.splitlines() if line.startswith("note: specforge:")]
    assert len(said) == 1 and "10 samples" in said[0] and "70 reasoning tokens" in said[0]
    assert "qwen3-thinking" in said[0]
    card = (tmp_path / "out/export/specforge/README.md").read_text()
    assert "SpecForge's general parser" in card and "qwen3-thinking" in card


@pytest.mark.parametrize(("model", "family", "history_shows"), [
    ("qwen/qwen3-8b", "qwen3", False),  # Qwen3's template drops earlier turns' reasoning
    ("moonshotai/kimi-k3", "kimi-k3", True),  # Kimi K3 keeps it
])  # fmt: skip
def test_sequential_history_keeps_the_reasoning_the_template_shows_in_every_format(
    tmp_path: Path, model: str, family: str, history_shows: bool
) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"c{c} first question"},
                {"role": "assistant", "content": "original 1"},
                {"role": "user", "content": f"c{c} second question"},
                {"role": "assistant", "content": "original 2"},
            ]
        }
        for c in range(8)
    ]
    write_rows(tmp_path / "d.jsonl", rows)
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[],
            extra='\n[[datasets]]\nname = "d"\npath = "d.jsonl"\nmode = "sequential"\n',
        )
        text = job.read_text().replace("moonshotai/kimi-k2.5", model)
        job.write_text(text.replace("max_tokens = 512", "max_tokens = 8000"))
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("export", str(tmp_path / "out"), "--format", "sharegpt", "--family", family)
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "out/export/sharegpt/train/d.jsonl").read_text()
    recs = [json.loads(x) for x in text.splitlines()]
    # Second turns (a cut answer is left out of the export, and so may a few be).
    seconds = [r for r in recs if r["provenance"]["turn_index"] == 3]
    assert len(seconds) >= 6
    for rec in seconds:
        earlier, last = rec["conversations"][1]["value"], rec["conversations"][3]["value"]
        assert last.startswith("<think>\n")  # the answer's own reasoning stays
        assert earlier.startswith("<think>\n") == history_shows, earlier
    # The formats that keep reasoning in a field of its own follow the same template.
    for fmt, key, flags in (
        ("openai", "messages", ()),
        ("specforge", "conversations", ("--train-source-turns",)),
    ):
        res = run_cli("export", str(tmp_path / "out"), "--format", fmt, "--family", family, *flags)
        assert res.returncode == 0, res.stdout + res.stderr
        text = (tmp_path / f"out/export/{fmt}/train/d.jsonl").read_text()
        seconds = [json.loads(x) for x in text.splitlines()]
        seconds = [r for r in seconds if r["provenance"]["turn_index"] == 3]
        assert len(seconds) >= 6
        for rec in seconds:
            earlier, last = rec[key][1], rec[key][3]
            assert last.get("reasoning_content"), fmt
            assert bool(earlier.get("reasoning_content")) == history_shows, (fmt, earlier)


def test_a_source_history_whose_reasoning_the_template_hides_is_still_the_sources(
    tmp_path: Path,
) -> None:
    """The dataset's own earlier answer, with reasoning Qwen3's template does not show, is
    still the dataset's: left out of a default sharegpt export (`source_history`), and named
    `history: source` where it is written."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"c{c} first question"},
                {"role": "assistant", "content": f"SOURCE answer {c}", "reasoning_content": "hm"},
                {"role": "user", "content": f"c{c} second question"},
            ]
        }
        for c in range(6)
    ]
    write_rows(tmp_path / "d.jsonl", rows)
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[],
            extra='\n[[datasets]]\nname = "d"\npath = "d.jsonl"\nmode = "last_turn"\n',
        )
        text = job.read_text().replace("moonshotai/kimi-k2.5", "qwen/qwen3-8b")
        job.write_text(text.replace("max_tokens = 512", "max_tokens = 8000"))
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
    out = str(tmp_path / "out")
    res = run_cli("export", out, "--format", "sharegpt", "--family", "qwen3")
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = json.loads((tmp_path / "out/export/sharegpt/manifest.json").read_text())
    assert manifest["datasets"]["d"]["dropped"].get("source_history") == 6, manifest
    res = run_cli("export", out, "--format", "openai", "--family", "qwen3")
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "out/export/openai/train/d.jsonl").read_text()
    recs = [json.loads(x) for x in text.splitlines()]
    assert len(recs) == 6
    for rec in recs:
        assert rec["provenance"]["history"] == "source"
        assert rec["messages"][1]["weight"] == 0 and "reasoning_content" not in rec["messages"][1]


def test_a_sharegpt_export_goes_on_without_a_target_it_cannot_load(tmp_path: Path) -> None:
    store, items = answered_store(tmp_path)
    for n, item in enumerate(items["v1.5"]):
        add_answer(store, "v1.5", item, n)
    store.close()
    out = str(tmp_path / "out")
    nope = str(tmp_path / "nope.json")
    res = run_cli("export", out, "--format", "sharegpt", "--family", "qwen3", "--tokenizer", nope)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "history's reasoning is written as it was stored" in res.stderr
    # Where the ids need it, it is still an error.
    res = run_cli("export", out, "--format", "tokenized", "--family", "qwen3", "--tokenizer", nope)
    assert res.returncode != 0 and "nope.json" in res.stderr


@pytest.mark.parametrize("fmt", ["tokenized", "openai"])
def test_the_card_reads_back_through_the_hubs_own_classes_and_loads_every_part(
    tmp_path: Path, fmt: str
) -> None:
    datasets = pytest.importorskip("datasets")
    from huggingface_hub import DatasetCard

    store, items = answered_store(tmp_path)
    to, target = tmp_path / "export", local_target(tmp_path)
    for part, since_last in ((slice(0, 6), False), (slice(6, 10), True)):
        for ds in NAMES:
            for n, item in enumerate(items[ds][part]):
                add_answer(store, ds, item, n)
        opts = ExportOptions(
            format=fmt, shard_rows=3, validation_fraction=0.3, since_last=since_last
        )
        manifest = export_job(store, list(NAMES), to, opts, target)
        time.sleep(0.01)  # the next part's answers are stored after this export
    card = DatasetCard.load(to / "README.md").data
    assert card.license == "unknown" and {"regen", "synthetic"} <= set(card.tags)
    assert card.pretty_name and card.task_categories == ["text-generation"]
    assert [c["config_name"] for c in card.configs] == list(NAMES)
    assert card.configs[0]["default"] is True
    listed = []
    for config in card.configs:
        splits = {f["split"]: f["path"] for f in config["data_files"]}
        assert splits == manifest["data_files"][config["config_name"]]
        listed += [p for paths in splits.values() for p in paths]
    data = sorted(str(p.relative_to(to)) for p in to.rglob("*") if p.parent != to)
    assert sorted(listed) == data and any(".part0001" in p for p in data)
    for ds in NAMES:  # every part of every split of every config, nothing of another
        rows = 0
        for split in card.configs[NAMES.index(ds)]["data_files"]:
            loaded = datasets.load_dataset(str(to), ds, split=split["split"])
            rows += loaded.num_rows
            names = loaded["dataset"] if fmt == "tokenized" else loaded["provenance"]
            assert all((n if fmt == "tokenized" else n["dataset"]) == ds for n in names)
        assert rows == 10
    # Its contents table counts every part the folder holds, as its configs list them.
    text = (to / "README.md").read_text()
    assert "Counts over all 2 parts in this folder" in text
    for ds in NAMES:
        cells = next(r for r in text.splitlines() if r.startswith(f"| {ds} |")).split(" | ")
        assert int(cells[2]) + int(cells[3]) == 10, cells


def test_the_cards_licence_is_the_one_given(tmp_path: Path) -> None:
    from huggingface_hub import DatasetCard

    store, items = answered_store(tmp_path)
    for n, item in enumerate(items["v1.5"]):
        add_answer(store, "v1.5", item, n)
    to = tmp_path / "export"
    export_job(store, ["v1.5"], to, ExportOptions(format="openai", license="cc-by-4.0"))
    assert DatasetCard.load(to / "README.md").data.license == "cc-by-4.0"
    with pytest.raises(StateError, match="--license takes a Hub licence id"):
        export_job(store, ["v1.5"], to, ExportOptions(format="openai", license="MIT\nx: 1"))
