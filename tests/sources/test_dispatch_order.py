"""The dispatch order ingest gives (issue 50): a conversation's items go out one after another,
the longest prompt first, while conversations stay shuffled; each item keeps its own place in
the shuffle (`pilot_key`) for a pilot to sample by."""

from __future__ import annotations

import json
from pathlib import Path

from regen.config import load_job
from regen.sources.ingest import ingest, order_key
from regen.sources.modes import item_id
from regen.state.db import Store
from tests.conftest import query


def conversations(n: int, turns: int) -> list[dict[str, object]]:
    """`n` conversations of `turns` user turns each, and one single-turn row after them."""
    convs: list[dict[str, object]] = []
    for c in range(n):
        messages = []
        for t in range(turns):
            messages += [
                {"role": "user", "content": f"conversation {c} question {t}"},
                {"role": "assistant", "content": f"conversation {c} answer {t}"},
            ]
        convs.append({"messages": messages})
    return convs


def read(tmp: Path, rows: list[dict[str, object]], settings: str, run: str = "") -> Path:
    """Ingest `rows` as dataset `chats` with `settings`; the job's output folder."""
    (tmp / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "job.toml").write_text(
        f'[job]\noutput_dir = "out"\n[generation]\nmodel = "m"\n[run]\n{run}\n'
        f'[[datasets]]\nname = "chats"\npath = "chats.jsonl"\n{settings}\n'
    )
    job = load_job(tmp / "job.toml")
    store = Store.open(job.output_path)
    try:
        ingest(store, job)
    finally:
        store.close()
    return job.output_path


ORDER = (
    "SELECT c.row_index, i.turn_index, i.sample, c.id, i.order_key, i.pilot_key FROM items i "
    "JOIN conversations c ON c.id = i.conversation_id ORDER BY i.order_key"
)


def test_a_conversations_items_are_contiguous_longest_prompt_first(tmp_path: Path) -> None:
    """Each conversation's 15 items (5 turns x 3 samples) are one run of the dispatch order,
    its last turn first, each turn's samples right after it; the conversations are shuffled;
    every item's pilot key is its own place in the shuffle, as its order key was before."""
    rows = conversations(12, 5) + [{"messages": [{"role": "user", "content": "alone"}]}]
    out = read(tmp_path, rows, 'mode = "each_turn"\nsamples = 3')
    order = query(out, ORDER)
    assert len(order) == 12 * 5 * 3 + 3
    runs: list[list[tuple[int, int, int]]] = []
    for row, turn, sample, *_ in order:
        if not runs or runs[-1][0][0] != row:
            runs.append([])
        runs[-1].append((row, turn, sample))
    assert sorted(len(r) for r in runs) == [3] + [15] * 12  # one run per conversation
    for run in runs:
        steps = [(t, k) for _, t, k in run]
        assert steps == sorted(steps, key=lambda s: (-s[0], s[1]))
    assert [r[0][0] for r in runs] != sorted(r[0][0] for r in runs)
    for _, turn, sample, cid, _, pilot in order:  # the job's shuffle seed is 0
        assert pilot == order_key(0, item_id(cid, turn)) + sample
    # The single-turn row keeps the place it always had: its own.
    alone = [(key, pilot) for row, _, _, _, key, pilot in order if row == 12]
    assert all(key == pilot for key, pilot in alone)


def test_cache_order_off_and_sequential_datasets_keep_each_items_own_place(
    tmp_path: Path,
) -> None:
    """`[run] cache_order = false`, and a sequential dataset (its turns wait on each other's
    answers anyway): every item's order key is its own place in the shuffle."""
    rows = conversations(8, 4)
    for settings, run in (
        ('mode = "each_turn"', "cache_order = false"),
        ('mode = "sequential"', ""),
    ):
        sub = tmp_path / settings.split('"')[1]
        sub.mkdir()
        order = query(read(sub, rows, settings, run), ORDER)
        assert len(order) == 8 * 4
        assert all(key == pilot for *_, key, pilot in order), settings
        changes = sum(a[0] != b[0] for a, b in zip(order, order[1:], strict=False))
        assert changes > 8, settings  # the conversations' turns are spread, not together
