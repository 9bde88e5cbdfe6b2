"""A conversation's items in dispatch (issue 50): a pilot samples items spread over the
conversations whatever the dispatch order, and a conversation's later items wait for its first
one to be computed, so that a provider's prefix cache holds what they repeat."""

from __future__ import annotations

from pathlib import Path

from regen.sim import SimConfig, sim_in_thread
from tests.conftest import query, run_cli, start_cli, write_job, write_rows


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


def conversation_turn(body: dict[str, object]) -> tuple[str, int]:
    """A logged request's conversation (its first question) and turn (messages sent)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"]).split(",")[0], len(messages)


def held_then_released(
    tmp: Path, rows: list[dict[str, object]], concurrency: int, leaders: int
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Run the job with every request held on the server until `leaders` of them wait, and no
    more come; then release them. The (conversation, messages) of the requests held, and of
    every request of the run."""
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0, log_bodies=True)) as sim:
        job = each_turn_job(tmp, sim.base_url, rows, concurrency=concurrency)
        sim.simulator.hold()
        running = start_cli("run", str(job))
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held >= leaders, timeout=60)
            # No later turn comes while the leaders are held (it would come at once).
            assert not sim.simulator.wait_until(lambda: sim.simulator.held > leaders, timeout=1)
            first = [conversation_turn(e.body or {}) for e in sim.simulator.chat_log()]
            sim.simulator.release()
            _, err = running.communicate(timeout=60)
            assert running.returncode == 0, err
        finally:
            if running.poll() is None:
                running.kill()
                running.communicate()
        return first, [conversation_turn(e.body or {}) for e in sim.simulator.chat_log()]


def test_a_conversations_later_turns_wait_until_its_first_one_is_answered(
    tmp_path: Path,
) -> None:
    """3 conversations of 4 turns and 10 single questions, 32 at once: with every request held
    on the server, each conversation's first item (its longest prompt) and the single
    questions reach it, and none of the conversations' other turns (a provider would compute
    their history again); released, they all go."""
    rows = turns_rows(3, 4) + [
        {"messages": [{"role": "user", "content": f"single {i}, question"}]} for i in range(10)
    ]
    first, log = held_then_released(tmp_path, rows, concurrency=32, leaders=13)
    conversations = {c for c, _ in first if c.startswith("conversation")}
    assert len(first) == 13 and len(conversations) == 3
    # Each conversation led by its last turn (7 messages before it); the others after.
    assert sorted(t for c, t in first if c in conversations) == [7, 7, 7]
    assert len(log) == 22 and sorted(log[13:]) == sorted(
        (c, t) for c in conversations for t in (1, 3, 5)
    )


def test_a_lane_full_of_waiting_turns_opens_no_new_conversation(tmp_path: Path) -> None:
    """Two conversations of 6 turns on a lane of 4 at once: the first one's 5 later turns
    fill the lane once its leader is answered, so the second conversation does not start
    meanwhile (its turns would wait for the lane longer than a provider keeps its cache)."""
    first, log = held_then_released(tmp_path, turns_rows(2, 6), concurrency=4, leaders=1)
    assert [t for _, t in first] == [11]
    # Released, every turn goes; the second conversation's last turn first.
    second = [t for c, t in log if c != first[0][0]]
    assert len(log) == 12 and log[0] == first[0] and len(second) == 6 and second[0] == 11


def test_a_prompts_later_samples_wait_for_its_first_on_a_hosted_lane(tmp_path: Path) -> None:
    """Two prompts of 3 samples each on an OpenRouter lane, which sends each sample as its own
    request: with every request held, one sample of each prompt reaches the server (the
    others would compute the same prompt again meanwhile); released, all 6 go."""
    rows = [{"messages": [{"role": "user", "content": f"single {i}, question"}]} for i in range(2)]
    write_rows(tmp_path / "chats.jsonl", rows)
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0, log_bodies=True)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("chats", "chats.jsonl", "openai")])
        job.write_text(
            job.read_text().replace('format = "openai"\n', 'format = "openai"\nsamples = 3\n')
        )
        sim.simulator.hold()
        running = start_cli("run", str(job))
        try:
            assert sim.simulator.wait_until(lambda: sim.simulator.held >= 2, timeout=60)
            assert not sim.simulator.wait_until(lambda: sim.simulator.held > 2, timeout=1)
            first = sorted(conversation_turn(e.body or {}) for e in sim.simulator.chat_log())
            sim.simulator.release()
            _, err = running.communicate(timeout=60)
            assert running.returncode == 0, err
        finally:
            if running.poll() is None:
                running.kill()
                running.communicate()
        assert first == [("single 0", 1), ("single 1", 1)]
        assert len(sim.simulator.chat_log()) == 6
