"""A dataset's source rewritten under the same name (issue 46): the next run says what changed,
never sends a row no longer in it, and exports only the rows it holds (`--keep-orphans` writes
the others too); a read killed half-way leaves the last complete read's view."""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from regen.config import load_job
from regen.sim import SimConfig, sim_in_thread
from regen.sources.ingest import ingest, view_change_line
from regen.state.db import Store
from regen.state.reads import ViewChange
from tests.conftest import query, run_cli, write_job, write_rows

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


def rewrite_keeping_size_and_mtime(path: Path, rows: list[Row]) -> None:
    """Write `rows` over `path` so that only its content hash shows the change."""
    before = path.stat()
    write_rows(path, rows)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def places_changed(old: list[Row], new: list[Row]) -> tuple[int, int, int]:
    """(added, removed, changed) as the rule says: a row of `old` not in `new` is removed, one
    of `new` not in `old` is added, and a place where both happen is one changed row."""
    removed = {i for i, r in enumerate(old) if r not in new}
    added = {i for i, r in enumerate(new) if r not in old}
    both = len(removed & added)
    return len(added) - both, len(removed) - both, both


def statuses(out: Path) -> dict[str, str]:
    """Each row's item status, by its prompt."""
    rows = query(
        out,
        "SELECT c.data, i.status FROM items i JOIN conversations c ON c.id = i.conversation_id",
    )
    return {json.loads(data)["messages"][0]["content"]: status for data, status in rows}


def sent(sim_log: list[Any]) -> list[str]:
    return [str(e.body["messages"][-1]["content"]) for e in sim_log if e.body]


def exported(folder: Path) -> list[str]:
    """The prompts of an `openai` export's train split, in file order."""
    lines = (folder / "train" / "chat.jsonl").read_text().splitlines()
    return [json.loads(line)["messages"][0]["content"] for line in lines]


def card_count(folder: Path, what: str) -> int:
    """The answer count of the card's `what` row (`| model | NAME (N) |`)."""
    text = (folder / "README.md").read_text()
    m = re.search(rf"^\| {what} \| .*\((\d+)\) \|$", text, re.M)
    assert m, text
    return int(m[1])


@dataclass(frozen=True)
class Rewritten:
    """A job run once with part of its rows answered, its file rewritten (rows removed and
    changed, answered or not, and rows appended; same size, same mtime), and run again."""

    out: Path
    old: list[Row]
    new: list[Row]
    done: list[Row]
    """Rows answered by the first run, in file order."""
    pending: list[Row]
    second: CompletedProcess[str]
    sent: list[str]
    """The prompts the second run sent."""

    @property
    def gone(self) -> list[Row]:
        return [r for r in self.old if r not in self.new]


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> Rewritten:
    tmp = tmp_path_factory.mktemp("rewritten")
    old = [row(i) for i in range(30)]
    write_rows(tmp / "chat.jsonl", old)
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0, log_bodies=True)) as sim:
        job = write_job(tmp, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        plain = job.read_text()
        # A token budget answers some rows and leaves the others pending.
        job.write_text(plain.replace('format = "openai"', 'format = "openai"\ntoken_budget = 3000'))
        assert run_cli("run", str(job)).returncode == 0
        before = statuses(tmp / "out")
        done = [r for r in old if before[prompt(r)] == "done"]
        pending = [r for r in old if before[prompt(r)] == "pending"]
        assert len(done) >= 2 and len(pending) >= 2, before
        first = len(sim.simulator.chat_log())
        swap = {prompt(done[1]): 9001, prompt(pending[1]): 9002}
        new = [
            row(swap[prompt(r)], "Replaced") if prompt(r) in swap else r
            for r in old
            if r not in (done[0], pending[0])
        ] + [row(9003, "Appended"), row(9004, "Appended")]
        rewrite_keeping_size_and_mtime(tmp / "chat.jsonl", new)
        job.write_text(plain)
        second = run_cli("run", str(job))
        log = sim.simulator.chat_log()[first:]
    assert second.returncode == 0, second.stderr
    return Rewritten(tmp / "out", old, new, done, pending, second, sent(log))


def test_the_run_says_what_changed_and_sends_only_the_files_rows_not_answered(
    rewritten: Rewritten,
) -> None:
    r = rewritten
    added, removed, changed = places_changed(r.old, r.new)
    # Gone: done[0] and done[1] (answered), pending[0] and pending[1] (not).
    line = view_change_line("chat", ViewChange(added, removed, changed, 2, 2))
    assert "2 answers to rows no longer in it" in line
    assert line in r.second.stdout.splitlines(), r.second.stdout
    assert (r.out / "run.log").read_text().count(line) == 1
    answered = {prompt(x) for x in r.done}
    assert sorted(r.sent) == sorted(prompt(x) for x in r.new if prompt(x) not in answered)
    assert not {prompt(x) for x in r.gone} & set(r.sent)


def test_the_runs_export_holds_the_files_rows_in_its_order_and_says_what_it_left_out(
    rewritten: Rewritten,
) -> None:
    lines = (rewritten.out / "export" / "chat.jsonl").read_text().splitlines()
    run_export = [json.loads(x)["conversations"][0]["content"] for x in lines]
    assert run_export == [prompt(x) for x in rewritten.new]
    assert (
        f"export: 2 answer(s) of chat left out: their rows are no longer in its source as last "
        f"read; state.db keeps them (`regen export {rewritten.out} --keep-orphans` writes them)"
    ) in rewritten.second.stdout


@pytest.mark.parametrize("fmt", ["specforge", "openai", "sharegpt", "tokenized"])
def test_every_export_format_leaves_orphans_out_unless_kept(
    rewritten: Rewritten, tmp_path: Path, fmt: str
) -> None:
    ids = ["--family", "kimi-k2.5"] if fmt == "tokenized" else []
    for keep, samples, dropped, card in ((False, 30, {"orphan": 2}, 30), (True, 32, {}, 32)):
        to = tmp_path / f"{fmt}-{keep}"
        flags = ["--keep-orphans"] if keep else []
        res = run_cli(
            "export", str(rewritten.out), "--format", fmt, "--keep-truncated", "--to", str(to),
            *ids, *flags,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        manifest = json.loads((to / "manifest.json").read_text())["datasets"]["chat"]
        assert (sum(manifest["samples"].values()), manifest["dropped"]) == (samples, dropped)
        assert ("orphan 2" in res.stdout) is not keep
        assert card_count(to, "model") == card
    if fmt == "openai":
        assert exported(tmp_path / "openai-False") == [prompt(x) for x in rewritten.new]


def test_status_counts_the_answers_kept_for_rows_gone(rewritten: Rewritten) -> None:
    status = json.loads(run_cli("status", str(rewritten.out), "--json").stdout)["datasets"][0]
    assert (status["orphans"], status["items"], status["done"], status["pending"]) == (2, 30, 30, 0)
    assert "orphans" in run_cli("status", str(rewritten.out)).stdout


def test_since_last_parts_leave_out_answers_to_rows_gone_since_the_last_part(
    tmp_path: Path,
) -> None:
    old = [row(i) for i in range(12)]
    write_rows(tmp_path / "chat.jsonl", old)
    out, to = tmp_path / "out", tmp_path / "parts"
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        plain = job.read_text()
        job.write_text(plain.replace('format = "openai"', 'format = "openai"\ntoken_budget = 2000'))
        assert run_cli("run", str(job)).returncode == 0
        later = [r for r in old if statuses(out)[prompt(r)] == "pending"]
        assert len(later) >= 3
        export = ["export", str(out), "--format", "openai", "--keep-truncated", "--to", str(to)]
        assert run_cli(*export).returncode == 0
        job.write_text(plain)
        assert run_cli("run", str(job)).returncode == 0  # answers the rest
        write_rows(tmp_path / "chat.jsonl", [r for r in old if r not in later[:2]])
        assert run_cli("run", str(job)).returncode == 0
    res = run_cli(*export, "--since-last")
    assert res.returncode == 0, res.stderr
    part = json.loads((to / "manifest.json").read_text())
    assert part["part"] == 1 and part["datasets"]["chat"]["dropped"] == {"orphan": 2}
    written = (to / "train" / "chat.part0001.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["messages"][0]["content"] for x in written) == sorted(
        prompt(r) for r in later[2:]
    )


def test_an_unchanged_or_touched_file_is_not_read_again_and_nothing_is_said(
    tmp_path: Path,
) -> None:
    write_rows(tmp_path / "chat.jsonl", [row(i) for i in range(6)])
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        assert run_cli("run", str(job)).returncode == 0
        os.utime(tmp_path / "chat.jsonl")  # touched, not changed
        res = run_cli("run", str(job))
    assert res.returncode == 0, res.stderr
    assert "its source changed" not in res.stdout
    assert "not read again" in res.stdout


def test_a_read_killed_half_way_leaves_the_last_complete_reads_view(tmp_path: Path) -> None:
    old = [row(i) for i in range(12)]
    write_rows(tmp_path / "chat.jsonl", old)
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0, log_bodies=True)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")])
        assert run_cli("run", str(job)).returncode == 0
        first_sent = len(sim.simulator.chat_log())
        new = old[3:] + [row(100 + i, "Appended") for i in range(2)]
        write_rows(tmp_path / "chat.jsonl", new)
        # Killed with every row of the new file stored and its read not yet complete.
        killed = run_cli("run", str(job), env={"REGEN_CRASH_AT": "read:chat"}, process=True)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        out = tmp_path / "out"
        assert query(out, "SELECT COUNT(*) FROM items WHERE gone = 1") == [(0,)]
        res = run_cli("export", str(out), "--format", "openai", "--keep-truncated")
        assert res.returncode == 0, res.stderr
        # The same rows (those the cut read found have their new places already).
        assert sorted(exported(out / "export" / "openai")) == sorted(prompt(r) for r in old)
        status = json.loads(run_cli("status", str(out), "--json").stdout)["datasets"][0]
        assert (status["orphans"], status["done"]) == (0, 12)

        res = run_cli("run", str(job))
        second = sent(sim.simulator.chat_log()[first_sent:])
    assert res.returncode == 0, res.stderr
    added, removed, changed = places_changed(old, new)
    assert view_change_line("chat", ViewChange(added, removed, changed, 0, 3)) in res.stdout
    assert sorted(second) == sorted(prompt(r) for r in new[-2:])
    res = run_cli("export", str(out), "--format", "openai", "--keep-truncated")
    assert exported(out / "export" / "openai") == [prompt(r) for r in new]


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
        "UPDATE items SET lane = 'long', escalated = 1, escalated_at = 1 WHERE id IN (?, ?)",
        ids[1:5:3],
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
