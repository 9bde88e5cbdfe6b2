"""A conversation's items in dispatch (issue 50): a pilot samples items spread over the
conversations whatever the dispatch order, and a conversation's later items wait for its first
one to be computed, so that a provider's prefix cache holds what they repeat."""

from __future__ import annotations

from pathlib import Path

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import query, run_cli, write_job, write_rows


def turns_rows(n: int, turns: int) -> list[dict[str, object]]:
    """`n` conversations of `turns` user turns each."""
    rows: list[dict[str, object]] = []
    for c in range(n):
        messages = []
        for t in range(turns):
            messages += [
                {"role": "user", "content": f"conversation {c}, question {t}: say more."},
                {"role": "assistant", "content": f"answer {t} of conversation {c}"},
            ]
        rows.append({"messages": messages})
    return rows


def each_turn_job(tmp: Path, base_url: str, rows: list[dict[str, object]], **kw: int) -> Path:
    """A job of one each_turn dataset `chats` of `rows`."""
    write_rows(tmp / "chats.jsonl", rows)
    job = write_job(tmp, base_url, datasets=[("chats", "chats.jsonl", "openai")], **kw)
    job.write_text(
        job.read_text().replace('format = "openai"\n', 'format = "openai"\nmode = "each_turn"\n')
    )
    return job


def test_a_pilot_samples_items_spread_over_the_conversations(tmp_path: Path) -> None:
    """200 conversations of 5 turns, their turns together in the dispatch order: a pilot of 20
    items answers turns of nearly 20 conversations (a draw of 20 of the 1000 items), not the 4
    whole conversations at the head of the dispatch order."""
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = each_turn_job(tmp_path, sim.base_url, turns_rows(200, 5))
        plan = run_cli("plan", str(job), "--pilot", "20", "--json")
        assert plan.returncode == 0, plan.stderr
    (answered, conversations) = query(
        tmp_path / "out",
        "SELECT COUNT(*), COUNT(DISTINCT conversation_id) FROM items WHERE status = 'done'",
    )[0]
    assert answered == 20
    assert conversations >= 16, conversations
