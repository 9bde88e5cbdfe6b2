"""A dataset's source rewritten under the same name (issue 46): a complete read says what
changed, and the items of rows no longer in it are sent by no lane and counted nowhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regen.config import load_job
from regen.sources.ingest import ingest, view_change_line
from regen.state.db import Store
from regen.state.reads import ViewChange
from tests.conftest import write_rows

Row = dict[str, Any]


def row(i: int, tag: str = "Question") -> Row:
    """A row whose JSON line has the same length for every tag of 8 letters and i < 10,000."""
    return {
        "messages": [
            {"role": "user", "content": f"{tag} {i:04d}: explain this step."},
            {"role": "assistant", "content": "the dataset's own answer"},
        ]
    }


def prompt(r: Row) -> str:
    return str(r["messages"][0]["content"])


def folder_job(tmp: Path) -> Path:
    (tmp / "job.toml").write_text(
        """
[job]
name = "folder"
output_dir = "out"
[endpoint]
base_url = "http://127.0.0.1:9"
api_key_env = "REGEN_TEST_KEY"
[generation]
model = "m"
max_tokens = 16
[[datasets]]
name = "chat"
path = "chat"
format = "openai"
"""
    )
    return tmp / "job.toml"


def in_view(store: Store) -> list[str]:
    items = store.work.claim_batch("chat", -1, 100)
    return sorted(prompt(i.conversation) for i in items)


def test_a_file_gone_from_a_folder_takes_its_rows_out_of_view_and_back_when_restored(
    tmp_path: Path,
) -> None:
    """Rows are the folder's, over its files. A prompt that a remaining row shares with a
    removed one stays in view: the remaining row's item is the removed row's (one item per
    prompt), and its answer is still the answer to a row in the file."""
    (tmp_path / "chat").mkdir()
    a = [row(i) for i in range(5)]
    b = [row(i) for i in range(5, 8)]
    twin = {"messages": [a[0]["messages"][0], {"role": "assistant", "content": "another"}]}
    write_rows(tmp_path / "chat" / "a.jsonl", a)
    write_rows(tmp_path / "chat" / "b.jsonl", [*b, twin])
    job = load_job(folder_job(tmp_path))
    store = Store.open(job.output_path)
    assert ingest(store, job) == []
    assert in_view(store) == sorted(prompt(r) for r in a + b)

    moved = tmp_path / "a.jsonl"
    (tmp_path / "chat" / "a.jsonl").rename(moved)
    lines = ingest(store, job)
    assert lines == [view_change_line("chat", ViewChange(removed=4, left_pending=4))]
    assert in_view(store) == sorted(prompt(r) for r in [a[0], *b])
    (progress,) = store.work.dataset_progress()
    assert (progress.items, progress.pending, progress.orphans) == (4, 4, 0)

    moved.rename(tmp_path / "chat" / "a.jsonl")
    assert ingest(store, job) == [view_change_line("chat", ViewChange(added=4))]
    assert in_view(store) == sorted(prompt(r) for r in a + b)


def test_items_gone_from_view_are_claimed_by_no_lane_and_counted_nowhere(tmp_path: Path) -> None:
    from regen.sources.modes import item_id
    from regen.state.work import LaneRule, NewConversation, NewItem

    store = Store.open(tmp_path)
    store.sources.register("ds", 0, "src")

    def conv(k: int, **item: Any) -> tuple[str, NewConversation]:
        cid, iid = f"c{k}", item_id(f"c{k}", 1)
        new = NewItem(iid, 1, f"p{k}", k, 10 * k, **item)
        return iid, NewConversation(cid, "ds", k, json.dumps(row(k)), [new])

    rows = [conv(k, lane="short") for k in range(6)]
    store.work.add_conversations([c for _, c in rows])
    ids = [i for i, _ in rows]
    # Items 0-2 stay in view; 3 (pending, no lane), 4 (escalated), 5 (failed) leave it.
    store._db.execute("UPDATE items SET lane = NULL WHERE id = ?", (ids[3],))
    store._db.execute(
        "UPDATE items SET lane = 'long', escalated = 1 WHERE id IN (?, ?)", ids[1:5:3]
    )
    store._db.execute(
        "UPDATE items SET status = 'failed', failure_class = 'server' WHERE id IN (?, ?)",
        (ids[2], ids[5]),
    )
    store._db.execute("UPDATE items SET gone = 1 WHERE id IN (?, ?, ?)", ids[3:])

    assert [i.id for i in store.work.claim_batch("ds", -1, 10, "short")] == [ids[0]]
    assert [i.id for i in store.work.claim_escalated("long", 10)] == [ids[1]]
    assert store.work.escalated_pending("ds") == 1
    assert store.work.pending_flows() == {("short", "ds"): (1, 0), ("long", "ds"): (1, 10)}
    assert store.work.dataset_samples()["ds"].pending == 2
    (p,) = store.work.dataset_progress()
    assert (p.items, p.pending, p.failed, p.orphans) == (3, 2, 1, 0)
    # No lane selects item 3 (30 tokens), which is not said: it is not the job's any more.
    rules = [LaneRule("short", max_prompt_tokens=20), LaneRule("long", datasets=["other"])]
    assert store.work.assign_lanes(rules) == {}
    assert store.work.requeue_retryable_failures({"server"}) == 1  # item 2 only
    assert [i.id for i in store.work.claim_batch("ds", -1, 10, "short")] == ids[:3:2]
