"""`regen run` end to end: a real subprocess against a real simulator on 127.0.0.1."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from regen.sim import RunningSim
from tests.conftest import (
    SECRET_KEY,
    add_to_section,
    chat_rows,
    query,
    run_cli,
    write_job,
    write_rows,
)


def three_datasets(tmp: Path) -> list[tuple[str, str, str]]:
    rows = chat_rows(30)
    rows.append(rows[3])  # an exact duplicate: sent once
    write_rows(tmp / "chat.jsonl", rows)
    (tmp / "chat.jsonl").write_text((tmp / "chat.jsonl").read_text() + "{not json\n")
    sharegpt = [
        {"conversations": [{"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": "x"}]}
        for i in range(15)
    ]
    (tmp / "sg.json").write_text(json.dumps(sharegpt))
    write_rows(
        tmp / "code.jsonl", [{"instruction": f"write code {i}", "output": "o"} for i in range(10)]
    )
    return [
        ("chat", "chat.jsonl", "openai"),
        ("sg", "sg.json", "sharegpt"),
        ("code", "code.jsonl", "alpaca"),
    ]


def test_run_regenerates_stores_and_exports_every_dataset(tmp_path: Path, sim: RunningSim) -> None:
    job = write_job(tmp_path, sim.base_url, datasets=three_datasets(tmp_path))
    proc = run_cli("run", str(job))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"

    # Every request carried the key as a Bearer header.
    chats = [e for e in sim.simulator.log if e.path.endswith("/chat/completions")]
    assert len(chats) == 30 + 15 + 10
    assert {e.authorization for e in chats} == {f"Bearer {SECRET_KEY}"}

    # state.db holds each result with its usage, cost, provider and latency.
    db = sqlite3.connect(out / "state.db")
    results = db.execute(
        "SELECT dataset, COUNT(*), SUM(completion_tokens), SUM(cost_usd), "
        "COUNT(provider), MIN(latency_s) >= 0 FROM results GROUP BY dataset ORDER BY dataset"
    ).fetchall()
    assert [(r[0], r[1]) for r in results] == [("chat", 30), ("code", 10), ("sg", 15)]
    assert all(r[4] == r[1] and r[5] for r in results)
    total_cost = db.execute("SELECT SUM(cost_usd) FROM ledger").fetchone()[0]
    assert abs(total_cost - sim.simulator.billed_usd()) < 1e-9
    bad = db.execute("SELECT dataset, row_index, reason FROM bad_rows").fetchall()
    assert len(bad) == 1 and bad[0][:2] == ("chat", 31) and "invalid JSON" in bad[0][2]

    # The export has each item once, in SpecForge form, with the regenerated turn in place.
    lines = (out / "export" / "chat.jsonl").read_text().splitlines()
    assert len(lines) == 30
    recs = [json.loads(line) for line in lines]
    assert len({r["id"] for r in recs}) == 30
    first = recs[0]
    assert [m["role"] for m in first["conversations"]] == ["user", "assistant"]
    regenerated = first["conversations"][-1]
    assert regenerated["content"] != "original answer 0"
    assert regenerated["reasoning_content"]
    stored = db.execute("SELECT content FROM results WHERE item_id = ?", (first["id"],)).fetchone()[
        0
    ]
    assert regenerated["content"] == stored
    assert len((out / "export" / "sg.jsonl").read_text().splitlines()) == 15

    # The summary names every dataset and the output folder.
    assert "output:" in proc.stdout and str(out) in proc.stdout.replace("\n", "")
    for name in ("chat", "sg", "code"):
        assert name in proc.stdout
    # Non-TTY progress: plain key=value lines, also in run.log.
    assert "progress done=55/55" in proc.stdout
    assert "progress done=55/55" in (out / "run.log").read_text()

    # The key is in no file under the output directory.
    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET_KEY.encode() not in path.read_bytes(), path


def test_rerun_sends_nothing_and_an_added_row_sends_one(tmp_path: Path, sim: RunningSim) -> None:
    job = write_job(tmp_path, sim.base_url)
    assert run_cli("run", str(job)).returncode == 0
    sent = len(sim.simulator.log)
    proc = run_cli("run", str(job))
    assert proc.returncode == 0, proc.stderr
    assert len(sim.simulator.log) == sent
    assert "progress done=20/20" in proc.stdout

    rows = chat_rows(21)
    write_rows(tmp_path / "chat.jsonl", rows)
    assert run_cli("run", str(job)).returncode == 0
    assert len(sim.simulator.log) == sent + 1
    export = (tmp_path / "out" / "export" / "chat.jsonl").read_text().splitlines()
    assert len(export) == 21


def failing(job: Path, fault: str = "500") -> None:
    """Every request of the job gets this fault from the simulator, and is tried once."""
    add_to_section(job, "endpoint", f'headers = {{ "X-Sim-Fault" = "{fault}" }}')
    add_to_section(job, "run", "max_attempts = 1")


def test_run_with_failed_items_exits_3_and_keeps_them_out_of_the_export(
    tmp_path: Path, sim: RunningSim
) -> None:
    job = write_job(tmp_path, sim.base_url, extra="stop_error_rate = 1.0")
    failing(job)
    proc = run_cli("run", str(job))
    assert proc.returncode == 3, proc.stderr
    assert "server:20" in proc.stdout
    assert (tmp_path / "out" / "export" / "chat.jsonl").read_text() == ""


def test_a_high_error_rate_stops_the_run(tmp_path: Path, sim: RunningSim) -> None:
    job = write_job(tmp_path, sim.base_url, rows=300, concurrency=4)
    failing(job)
    proc = run_cli("run", str(job))
    assert proc.returncode == 1
    assert "error: run stopped: error rate 100% over the last 20 items" in proc.stderr
    assert len(sim.simulator.chat_log()) < 30  # not all 300


def test_an_error_every_request_gets_stops_the_run_and_leaves_the_items_pending(
    tmp_path: Path, sim: RunningSim
) -> None:
    """A wrong model name failed every item for good within 60 ms, and the fixed job then
    sent nothing. The server's error stops the run; the items stay pending; the fixed job
    (a changed model needs --force) sends them all."""
    job = write_job(tmp_path, sim.base_url, rows=300, concurrency=8)
    right = job.read_text()
    job.write_text(right.replace('"moonshotai/kimi-k2.5"', '"no/such-model"'))
    proc = run_cli("run", str(job))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: run stopped: every request fails with the same error: ")
    assert "no/such-model is not a valid model ID" in line and "stay pending" in line
    out = tmp_path / "out"
    assert query(out, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("pending", 300)]
    job.write_text(right)
    fixed = run_cli("run", str(job), "--force")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert query(out, "SELECT status, COUNT(*) FROM items GROUP BY status") == [("done", 300)]


def test_wrong_key_stops_the_run_with_a_clear_message(tmp_path: Path) -> None:
    from regen.sim import SimConfig, sim_in_thread

    with sim_in_thread(SimConfig(time_scale=0, api_keys=["sk-right"])) as sim:
        job = write_job(tmp_path, sim.base_url)
        proc = run_cli("run", str(job), env={"REGEN_TEST_KEY": "sk-wrong"})
        assert proc.returncode == 1
        assert "error: run stopped: auth: User not found." in proc.stderr
        assert len(sim.simulator.log) <= 16  # the concurrency: nothing after the stop
        proc = run_cli("run", str(job), env={"REGEN_TEST_KEY": "sk-right"})
        assert proc.returncode == 0, proc.stderr
    export = (tmp_path / "out" / "export" / "chat.jsonl").read_text().splitlines()
    assert len(export) == 20


def test_a_provider_that_answers_four_in_five_never_stops_the_job(tmp_path: Path) -> None:
    """20% fast 502s: they come back long before the first answers, and the error-rate stop
    once judged them alone. It judges items after their retries."""
    from regen.sim import SimConfig, sim_in_thread
    from regen.sim.config import SimFaults
    from tests.conftest import write_rows

    write_rows(tmp_path / "chat.jsonl", chat_rows(200))
    faults = SimFaults(http_5xx=0.2, http_5xx_codes=[502])
    with sim_in_thread(SimConfig(seed=4, time_scale=0.05, faults=faults)) as sim:
        job = write_job(
            tmp_path, sim.base_url, datasets=[("chat", "chat.jsonl", "openai")], concurrency=64
        )
        proc = run_cli("run", str(job))
        statuses = [e.status for e in sim.simulator.chat_log()]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert statuses.count(502) > 20  # the faults were there
    assert "error rate" not in proc.stderr
