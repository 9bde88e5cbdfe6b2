"""Ingest at speed, without changing what it stores: a rerun whose sources did not change does
not read them again, a changed source is read again as before, and the faster path stores the
very ids, prompt hashes, estimates and bad rows that the definitions in conversation.py and
modes.py give."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from regen.config import Job, load_job
from regen.conversation import Conversation
from regen.sources import Source
from regen.sources.ingest import ingest, order_key
from regen.sources.modes import item_id, prompt_hash, target_turns
from regen.state.db import Store
from tests.conftest import query

FIXTURES = Path(__file__).parent / "fixtures"

ANSWER_X = {"role": "assistant", "content": "x"}
ANSWER_Y = {"role": "assistant", "content": "y"}
# Rows that take the slow paths: floats in tools (json and orjson write some differently),
# escapes, a UTF-8 BOM, NaN and huge integers (only the json module reads those), text
# parts, a lone surrogate, bad lines, a duplicate prompt, a prompt over the limit.
MIXED = [
    '{"messages": [{"role": "user", "content": "h\\u00e9llo \\u2028 \\u0001 \\u007f \\ud83d\\ude00'
    ' \\"q\\" </"}, {"role": "assistant", "content": "a"}]}',
    '{"messages": [{"role": "user", "content": "tools"}, {"role": "assistant", "content": "", '
    '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '
    '{"x": 1.5e-7, "y": 1e16}}}]}, {"role": "tool", "content": "r", "tool_call_id": "c1"}], '
    '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"minimum": 1e-07,'
    ' "maximum": 1e+16, "default": 0.1}}}]}',
    '{"messages": [{"role": "user", "content": "nan"}], "x": NaN}',
    '{"messages": [{"role": "user", "content": "big"}], "x": 123456789012345678901234567890}',
    '{"messages": [{"role": "user", "content": "lone \\ud800 surrogate"}]}',
    '\ufeff{"messages": [{"role": "user", "content": "bom"}]}',
    "not json",
    "[1, 2]",
    "",
    '{"messages": [{"role": "robot", "content": "x"}]}',
    '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}, '
    '{"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}, '
    '{"role": "assistant", "content": "<think>r</think>a2", "name": "bob"}]}',
    '{"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], '
    '"tools": "[{\\"name\\": \\"g\\", \\"parameters\\": {\\"a\\": 2.50}}]"}',
    json.dumps({"messages": [{"role": "user", "content": "q" * 5000}]}),
    json.dumps({"messages": [{"role": "user", "content": "same"}, ANSWER_X]}),
    json.dumps({"messages": [{"role": "user", "content": "same"}, ANSWER_Y]}),
]


def job_file(tmp: Path, datasets: str) -> Job:
    (tmp / "job.toml").write_text(
        f'[job]\noutput_dir = "out"\n[generation]\nmodel = "m"\n{datasets}'
    )
    return load_job(tmp / "job.toml")


def read_once(tmp: Path, n: int) -> tuple[Path, Job, Store]:
    """A dataset `a` of `n` rows in `tmp/a.jsonl`, read once: the file, the job, its store."""
    p = tmp / "a.jsonl"
    p.write_text(rows(n))
    job = job_file(tmp, dataset("a", "a.jsonl"))
    store = Store.open(job.output_path)
    ingest(store, job)
    return p, job, store


def dataset(name: str, path: str, extra: str = "") -> str:
    return f'\n[[datasets]]\nname = "{name}"\npath = "{path}"\n{extra}\n'


def rows(n: int, start: int = 0) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n"
        for i in range(start, start + n)
    )


def state(out: Path) -> dict[str, Any]:
    return {
        "items": sorted(query(out, "SELECT id, prompt_hash, order_key FROM items")),
        "bad": query(out, "SELECT dataset, row_index, reason FROM bad_rows ORDER BY 1, 2"),
        "datasets": query(out, "SELECT name, rows_read, bad_rows, turns_read FROM datasets"),
    }


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The datasets whose rows are read (each Source iterated)."""
    seen: list[str] = []
    pairs = Source.pairs

    def spy(self: Source, start: int = 0) -> Any:
        seen.append(self.dataset)
        return pairs(self, start)

    monkeypatch.setattr(Source, "pairs", spy)
    return seen


def parquet_folder(folder: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for part in range(2):
        table = pa.Table.from_pylist(
            [{"messages": [{"role": "user", "content": f"p{part} {i}"}]} for i in range(n)]
        )
        pq.write_table(table, folder / f"part-{part}.parquet")


def test_a_rerun_with_unchanged_sources_does_not_read_them(
    tmp_path: Path, reads: list[str]
) -> None:
    (tmp_path / "a.jsonl").write_text(rows(20) + "{broken\n")
    parquet_folder(tmp_path / "pq", 10)
    job = job_file(tmp_path, dataset("a", "a.jsonl") + dataset("b", "pq"))
    store = Store.open(job.output_path)
    assert ingest(store, job) == []
    first = state(job.output_path)
    assert reads == ["a", "b"]
    notes = ingest(store, job)
    assert reads == ["a", "b"]  # not read again
    assert len(notes) == 1 and notes[0].startswith("not read again") and notes[0].endswith(": a, b")
    assert state(job.output_path) == first  # bad rows still listed, counts kept


def test_an_appended_row_is_read_and_adds_its_item(tmp_path: Path, reads: list[str]) -> None:
    p, job, store = read_once(tmp_path, 5)
    with p.open("a") as f:
        f.write(rows(1, start=5) + "[1]\n")
    assert ingest(store, job) == ["dataset a: its source changed since the last read: rows 1 added"]
    assert reads == ["a", "a"]
    assert query(job.output_path, "SELECT rows_read, bad_rows, turns_read FROM datasets") == [
        (7, 1, 6)
    ]
    assert query(job.output_path, "SELECT row_index, reason FROM bad_rows") == [
        (6, "row is not a JSON object")
    ]


def test_a_file_rewritten_with_the_same_size_and_time_is_read_again(
    tmp_path: Path, reads: list[str]
) -> None:
    p, job, store = read_once(tmp_path, 5)
    st = p.stat()
    p.write_text(rows(5).replace("question 3", "question X"))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    ingest(store, job)
    assert reads == ["a", "a"]  # the content hash saw the change
    assert query(job.output_path, "SELECT COUNT(*) FROM items") == [(6,)]


def test_a_file_touched_but_not_changed_is_not_read_again(tmp_path: Path, reads: list[str]) -> None:
    p, job, store = read_once(tmp_path, 5)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert "unchanged" in ingest(store, job)[0]
    assert reads == ["a"]


def test_changed_settings_or_files_of_a_folder_read_the_source_again(
    tmp_path: Path, reads: list[str]
) -> None:
    parquet_folder(tmp_path / "pq", 10)
    job = job_file(tmp_path, dataset("b", "pq"))
    store = Store.open(job.output_path)
    ingest(store, job)
    ingest(store, job_file(tmp_path, dataset("b", "pq", "limit = 5")))
    assert reads == ["b", "b"]
    shutil.copy(tmp_path / "pq" / "part-1.parquet", tmp_path / "pq" / "part-2.parquet")
    job = job_file(tmp_path, dataset("b", "pq"))
    ingest(store, job)
    assert reads == ["b", "b", "b"]
    assert query(job.output_path, "SELECT rows_read FROM datasets") == [(30,)]
    ingest(store, job)
    assert reads == ["b", "b", "b"]


def test_a_source_whose_read_failed_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    (tmp_path / "a.jsonl").write_text(rows(5))
    job = job_file(tmp_path, dataset("a", "a.jsonl", 'format = "auto"'))
    (tmp_path / "a.jsonl").write_text('{"instruction": "i", "conversations": []}\n')
    store = Store.open(job.output_path)
    with pytest.raises(Exception, match="fit formats"):
        ingest(store, job)
    (tmp_path / "a.jsonl").write_text(rows(5))
    assert ingest(store, job) == []
    assert reads == ["a", "a"]


def test_run_log_says_a_source_was_not_read_again(tmp_path: Path, sim: Any) -> None:
    from tests.conftest import run_cli, write_job

    (tmp_path / "d.jsonl").write_text(rows(3))
    job = write_job(tmp_path, sim.base_url, datasets=[], extra=dataset("d", "d.jsonl"))
    assert run_cli("run", str(job)).returncode == 0
    assert run_cli("run", str(job)).returncode == 0
    log = (tmp_path / "out" / "run.log").read_text()
    assert log.count("not read again, their files unchanged since the last read") == 1


def reference(
    conv: Conversation, mode: str, seed: int, limit: int | None
) -> list[tuple[str, str, int, int, int]]:
    """(item id, prompt hash, order key, pilot key, estimate) of each turn under `limit`, from
    the definitions: a turn's pilot key is its own place in the shuffle; its order key is its
    conversation's place (its first turn's), then its turns from the last to the first."""
    turns = target_turns(conv, mode)
    assert isinstance(turns, list)
    kept = [t for t in turns if limit is None or conv.estimate_prompt_tokens(t) <= limit]
    ids = [(t, item_id(conv.id, t)) for t in kept]
    place = order_key(seed, ids[0][1]) if ids else 0
    return [
        (
            iid,
            prompt_hash(conv, t),
            place + (len(ids) - 1 - j) * 1024,
            order_key(seed, iid),
            conv.estimate_prompt_tokens(t),
        )
        for j, (t, iid) in enumerate(ids)
    ]


@pytest.mark.parametrize("mode", ["last_turn", "each_turn"])
def test_ingested_ids_and_bad_rows_are_the_definitions(tmp_path: Path, mode: str) -> None:
    (tmp_path / "mixed.jsonl").write_text("\n".join(MIXED) + "\n")
    blocks = dataset("m", "mixed.jsonl", f'mode = "{mode}"\nmax_prompt_tokens = 1000')
    for name in ("b4_mixture_of_thoughts.jsonl", "b6_ultrachat_200k.jsonl", "b7_sharegpt.json"):
        shutil.copy(FIXTURES / name, tmp_path / name)
        blocks += dataset(name.split(".")[0], name, f'format = "auto"\nmode = "{mode}"')
    job = job_file(tmp_path, blocks)
    store = Store.open(job.output_path)
    ingest(store, job)
    for ds in job.datasets:
        source = Source(ds.name, job.resolve(ds.path), "auto" if ds.name != "m" else "openai")
        want_items: dict[str, tuple[str, str, int, int, int]] = {}
        for conv in source:
            if conv.row_index == 4 and ds.name == "m":
                continue  # the lone surrogate: a bad row (the definitions cannot hash it)
            if isinstance(conv, Conversation) and not isinstance(target_turns(conv, mode), str):
                for ref in reference(conv, mode, job.dataset_seed(ds), ds.max_prompt_tokens):
                    want_items.setdefault(ref[1], ref)  # the first row with a prompt
        got = query(
            job.output_path,
            f"SELECT id, prompt_hash, order_key, pilot_key, prompt_tokens_est FROM items "
            f"WHERE dataset = '{ds.name}'",
        )
        assert sorted(got) == sorted(want_items.values()), ds.name
    bad = dict(query(job.output_path, "SELECT row_index, reason FROM bad_rows WHERE dataset='m'"))
    assert bad == {
        4: "text with a lone surrogate (not Unicode)",
        6: "invalid JSON: Expecting value: line 1 column 1 (char 0)",
        7: "row is not a JSON object",
        9: "messages[0].role is 'robot' (allowed: system, user, assistant, tool)",
        12: "prompt over max_prompt_tokens (1256 estimated at turn 1, limit 1000)",
    }


def test_batches_commit_every_few_rows_and_give_the_connection_back_as_it_was(
    tmp_path: Path,
) -> None:
    from regen.state.work import NewConversation, NewItem

    store = Store.open(tmp_path)
    store.sources.register("d", 0, "src")
    cache = store._db.execute("PRAGMA cache_size").fetchone()

    def batch(k: int) -> list[NewConversation]:
        return [NewConversation(f"c{k}", "d", k, "{}", [NewItem(f"i{k}", 1, f"h{k}", k)])]

    assert store.work.add_conversation_batches((batch(k) for k in range(5)), commit_rows=2) == 5
    assert query(tmp_path, "SELECT COUNT(*) FROM items") == [(5,)]
    assert store._db.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert store._db.execute("PRAGMA cache_size").fetchone() == cache


LANES = """
[[lanes]]
name = "short"
datasets = ["a"]
max_prompt_tokens = 8
[[lanes]]
name = "mid"
min_prompt_tokens = 5
max_prompt_tokens = 12
[[lanes]]
name = "long"
datasets = ["a"]
"""


def test_items_are_read_into_the_lane_assign_lanes_gives_them(tmp_path: Path) -> None:
    from regen.sources.ingest import lane_rules

    # Prompts of 8 estimated tokens (question 0-9), 11 (10**12 on) and 18 (10**40 on).
    (tmp_path / "a.jsonl").write_text(rows(10) + rows(10, start=10**12) + rows(10, start=10**40))
    (tmp_path / "b.jsonl").write_text(rows(5) + rows(5, start=10**40))
    job = job_file(tmp_path, dataset("a", "a.jsonl") + dataset("b", "b.jsonl") + LANES)
    store = Store.open(job.output_path)
    ingest(store, job)
    lanes = query(job.output_path, "SELECT id, lane FROM items ORDER BY id")
    assert {lane for _, lane in lanes} == {"short", "mid", "long", None}
    assert store.work.assign_lanes(lane_rules(job)) == {"b": 5}
    assert query(job.output_path, "SELECT id, lane FROM items ORDER BY id") == lanes
    store._db.execute("UPDATE items SET lane = NULL")
    store.work.assign_lanes(lane_rules(job))
    assert query(job.output_path, "SELECT id, lane FROM items ORDER BY id") == lanes


def schema(out: Path) -> list[tuple[str, str]]:
    return query(out, "SELECT name, sql FROM sqlite_master WHERE type = 'index' ORDER BY name")


def test_a_first_read_builds_its_indexes_after_its_rows(tmp_path: Path) -> None:
    Store.open(tmp_path / "empty").close()
    (tmp_path / "a.jsonl").write_text(rows(50))
    job = job_file(tmp_path, dataset("a", "a.jsonl"))
    store = Store.open(job.output_path)
    ingest(store, job)
    assert schema(job.output_path) == schema(tmp_path / "empty")
    assert store.get_meta("deferred_indexes") is None
    plan = query(
        job.output_path,
        "EXPLAIN QUERY PLAN SELECT id FROM items WHERE dataset = 'a' AND status = 'pending' "
        "ORDER BY order_key",
    )
    assert "items_dispatch" in str(plan)


KILLED_READ = """
import os, signal, sys
from pathlib import Path
from regen.sources import ingest as ingest_mod
from regen.config import load_job
from regen.state.db import Store
from regen.state.work import Work

ingest_mod.INGEST_BATCH = 2
add = Work.add_conversation_batches

def killed_after_two_commits(self, batches, commit_rows=0, sort_rows=0):
    def feed():
        for k, batch in enumerate(batches):
            if k == 6:
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch
    return add(self, feed(), commit_rows=4, sort_rows=3)

Work.add_conversation_batches = killed_after_two_commits
job = load_job(Path(sys.argv[1]))
ingest_mod.ingest(Store.open(job.output_path), job)
"""


def test_a_read_killed_before_its_indexes_are_built_is_mended_and_completed(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    (tmp_path / "a.jsonl").write_text(rows(40) + rows(3))  # three duplicate prompts
    job = job_file(tmp_path, dataset("a", "a.jsonl"))
    (tmp_path / "clean").mkdir()
    clean = job_file(tmp_path / "clean", dataset("a", str(tmp_path / "a.jsonl")))
    ingest(Store.open(clean.output_path), clean)
    killed = subprocess.run([sys.executable, "-c", KILLED_READ, str(tmp_path / "job.toml")])
    assert killed.returncode == -9
    assert query(job.output_path, "SELECT value FROM meta WHERE key = 'deferred_indexes'") == [
        ("1",)
    ]
    assert 0 < query(job.output_path, "SELECT COUNT(*) FROM items")[0][0] < 40
    store = Store.open(job.output_path)
    assert schema(job.output_path) == schema(clean.output_path)
    assert store.get_meta("deferred_indexes") is None
    ingest(store, job)
    assert state(job.output_path) == state(clean.output_path)
