"""A job with all eight dataset families, in several file formats and modes, runs end to end on
the simulator; ingest options (filter, sample, system policy, prompt limit) select what they say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from regen.config import load_job
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from regen.sources.ingest import ingest
from regen.state.db import Store
from tests.conftest import query, run_cli, write_job, write_rows

FIXTURES = Path(__file__).parent / "fixtures"


def rows_of(name: str) -> list[dict[str, object]]:
    text = (FIXTURES / name).read_text()
    if name.endswith(".json"):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def eight_families(tmp: Path) -> str:
    """The fixtures laid out as a user would have them: each family in a different form."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copy(FIXTURES / "b1_glaive.json", tmp / "glaive.json")
    pq.write_table(pa.Table.from_pylist(rows_of("b2_opencodeinstruct.jsonl")), tmp / "oci.parquet")
    (tmp / "magicoder").mkdir()
    shutil.copy(FIXTURES / "b3_magicoder_oss.jsonl", tmp / "magicoder" / "a-oss.jsonl")
    shutil.copy(FIXTURES / "b3_magicoder_evol.jsonl", tmp / "magicoder" / "b-evol.jsonl")
    datasets.Dataset.from_list(rows_of("b4_mixture_of_thoughts.jsonl")).save_to_disk(
        str(tmp / "mot")
    )
    shutil.copy(FIXTURES / "b5_openthoughts3.jsonl", tmp / "ot3.jsonl")
    shutil.copy(FIXTURES / "b6_ultrachat_200k.jsonl", tmp / "ultrachat.jsonl")
    shutil.copy(FIXTURES / "b7_sharegpt.json", tmp / "sharegpt.json")
    (tmp / "swe").mkdir()
    for name in ("b8_swe_nebius.jsonl", "b8_swe_smith_xml.jsonl", "b8_openhands.jsonl"):
        shutil.copy(FIXTURES / name, tmp / "swe" / name)
    blocks = [
        ("B1", "glaive.json", "glaive", "each_turn"),
        ("B2", "oci.parquet", "auto", "last_turn"),
        ("B3", "magicoder", "magicoder", "last_turn"),
        ("B4", "mot", "auto", "last_turn"),
        ("B5", "ot3.jsonl", "openthoughts", "last_turn"),
        ("B6", "ultrachat.jsonl", "ultrachat", "sequential"),
        ("B7", "sharegpt.json", "sharegpt", "each_turn"),
        ("B8", "swe", "swe_agent", "each_turn"),
    ]
    return "".join(
        f'\n[[datasets]]\nname = "{n}"\npath = "{p}"\nformat = "{f}"\nmode = "{m}"\n'
        for n, p, f, m in blocks
    )


def test_all_eight_families_run_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0, log_bodies=True)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[], extra=eight_families(tmp_path))
        res = run_cli("run", str(job))
        log = sim.simulator.chat_log()
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    counts = dict(
        query(out, "SELECT dataset, COUNT(*) FROM items WHERE status = 'done' GROUP BY dataset")
    )
    # Turns: B1 3+1+2 (each_turn; row 2 is bad; row 3 ends on a function response, so one
    # more answer is asked), B2 2 (row 2 bad), B3 3, B4 2, B5 2, B6 2 (sequential), B7 2+1+1
    # (the leading gpt turn of a split piece is dropped), B8 2+2+2 (the xml trajectory
    # ends on an observation).
    assert counts == {"B1": 6, "B2": 2, "B3": 3, "B4": 2, "B5": 2, "B6": 2, "B7": 4, "B8": 6}
    assert query(out, "SELECT COUNT(*) FROM items WHERE status != 'done'") == [(0,)]
    bad = query(out, "SELECT dataset, row_index FROM bad_rows ORDER BY dataset, row_index")
    assert bad == [("B1", 2), ("B2", 2), ("B7", 3)]
    status = json.loads(run_cli("status", str(out), "--json").stdout)
    assert {r["dataset"]: r["rows"] for r in status["bad_row_reasons"]} == {
        "B1": 1,
        "B2": 1,
        "B7": 1,
    }
    assert any("not a known speaker" in r["example"] for r in status["bad_row_reasons"])
    rows = {r["dataset"]: (r["first_rows"], r["source"]) for r in status["bad_row_reasons"]}
    assert {ds: first for ds, (first, _) in rows.items()} == {"B1": [2], "B2": [2], "B7": [3]}
    assert [Path(source).name for _, source in sorted(rows.values())] == [
        "glaive.json",
        "oci.parquet",
        "sharegpt.json",
    ]
    formats = dict(query(out, "SELECT name, format FROM datasets"))
    assert formats["B2"] == "opencodeinstruct" and formats["B4"] == "mixture_of_thoughts"
    # Sequential: the second UltraChat turn was asked after the regenerated first answer.
    first, second = (
        r[0]
        for r in query(
            out,
            "SELECT r.content FROM results r JOIN items i ON i.id = r.item_id "
            "WHERE i.dataset = 'B6' ORDER BY i.turn_index",
        )
    )
    sent = [e.body for e in log if e.body and "Now make it funny." in json.dumps(e.body)]
    assert len(sent) == 1
    assert sent[0]["messages"][1]["content"] == first
    assert second
    # The export holds the regenerated first turn as the history of the second.
    exported = [json.loads(line) for line in (out / "export" / "B6.jsonl").read_text().splitlines()]
    assert exported[1]["conversations"][1]["content"] == first


def ingested(tmp: Path, dataset_lines: str, rows: list[dict[str, object]]) -> Store:
    tmp.mkdir(parents=True)
    write_rows(tmp / "d.jsonl", rows)
    job_path = write_job(
        tmp,
        "http://127.0.0.1:9",
        datasets=[],
        extra=f'\n[[datasets]]\nname = "d"\npath = "d.jsonl"\n{dataset_lines}\n',
    )
    job = load_job(job_path)
    store = Store.open(tmp / "out")
    ingest(store, job)
    return store


def chat(i: int, field: str = "x") -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": f"question {i} " + "word " * (i * 10)}],
        "field": field,
        "meta": {"lang": "py" if i % 3 == 0 else "js"},
    }


def test_filter_sample_and_limit_select_rows(tmp_path: Path) -> None:
    rows = [chat(i) for i in range(300)]
    store = ingested(tmp_path / "a", 'filter = {"meta.lang" = "py"}', rows)
    (p,) = store.work.dataset_progress()
    assert (p.rows_read, p.items) == (300, 100)
    store = ingested(tmp_path / "b", "sample = 0.25\nshuffle_seed = 3", rows)
    (p,) = store.work.dataset_progress()
    assert 50 < p.items < 100  # a quarter of 300, seeded
    store = ingested(tmp_path / "c", "sample = 40\nlimit = 200", rows)
    (p,) = store.work.dataset_progress()
    assert (p.rows_read, p.items) == (200, 40)
    rows_c = [r[0] for r in query(tmp_path / "c" / "out", "SELECT row_index FROM conversations")]
    assert max(rows_c) < 200 and len(set(rows_c)) == 40
    # The same seed picks the same rows; another seed others.
    again = ingested(tmp_path / "d", "sample = 40\nlimit = 200", rows)
    assert again.work.dataset_progress()[0].items == 40
    assert sorted(rows_c) == sorted(
        r[0] for r in query(tmp_path / "d" / "out", "SELECT row_index FROM conversations")
    )
    assert query(tmp_path / "c" / "out", "SELECT skipped_rows FROM datasets") == [(160,)]


def test_system_policies_and_prompt_limit(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "system", "content": "old"}, {"role": "user", "content": "q1"}]},
        {"messages": [{"role": "user", "content": "q2"}]},
        {"messages": [{"role": "user", "content": "long " * 4000}]},
    ]

    def systems(lines: str, sub: str) -> list[str | None]:
        ingested(tmp_path / sub, lines, rows)
        out = []
        for (data,) in query(
            tmp_path / sub / "out", "SELECT data FROM conversations ORDER BY row_index"
        ):
            msgs = json.loads(data)["messages"]
            out.append(msgs[0]["content"] if msgs[0]["role"] == "system" else None)
        return out

    assert systems("", "keep") == ["old", None, None]
    assert systems('system = "drop"', "drop") == [None, None, None]
    assert systems('system = "replace"\nsystem_prompt = "new"', "rep") == ["new", "new", "new"]
    assert systems('system = "fill"\nsystem_prompt = "new"', "fill") == ["old", "new", "new"]
    store = ingested(tmp_path / "lim", "max_prompt_tokens = 1000", rows)
    (bad,) = store.sources.bad_rows()
    assert bad.row_index == 2
    assert bad.reason.startswith("prompt over max_prompt_tokens (") and "limit 1000" in bad.reason


def answers_by_turn(out: Path) -> dict[tuple[int, int], str]:
    """Each stored answer by (source row, turn index)."""
    rows = query(
        out,
        "SELECT c.row_index, i.turn_index, r.content FROM results r "
        "JOIN items i ON i.id = r.item_id JOIN conversations c ON c.id = i.conversation_id",
    )
    return {(row, turn): content for row, turn, content in rows}


def test_sequential_turns_follow_their_regenerated_history_under_faults(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"c{c} first question"},
                {"role": "assistant", "content": "original 1"},
                {"role": "user", "content": f"c{c} second question"},
                {"role": "assistant", "content": "original 2"},
                {"role": "user", "content": f"c{c} third question"},
                {"role": "assistant", "content": "original 3"},
            ]
        }
        for c in range(40)
    ]
    write_rows(tmp_path / "d.jsonl", rows)
    faults = SimFaults(http_5xx=0.3, http_5xx_codes=[502])
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0, faults=faults, log_bodies=True)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[],
            concurrency=32,
            extra='max_attempts = 2\nstop_error_rate = 1.0\n\n[[datasets]]\nname = "d"\n'
            'path = "d.jsonl"\nmode = "sequential"\n',
        )
        res = run_cli("run", str(job))
        log = [e for e in sim.simulator.chat_log() if e.status == 200]
    assert res.returncode == 5, res.stderr  # turns left waiting (and some failed)
    out = tmp_path / "out"
    status = dict(query(out, "SELECT i.id, i.status FROM items i"))
    results = answers_by_turn(out)
    # Some first or second turns failed twice: the turns after them were never sent.
    assert sum(s == "failed" for s in status.values()) > 0
    assert sum(s == "pending" for s in status.values()) > 0
    by_turn = dict(query(out, "SELECT after_item IS NULL, COUNT(*) FROM items GROUP BY 1"))
    assert by_turn == {1: 40, 0: 80}
    # Every answered request for turn k carried the regenerated answers of turns before k.
    seen = set()
    for e in log:
        msgs = e.body["messages"]  # type: ignore[index]
        row = int(msgs[0]["content"].split()[0][1:])
        turn = len(msgs)
        for k in range(1, turn, 2):
            assert msgs[k]["content"] == results[(row, k)]
        seen.add((row, turn))
    assert seen == set(results)  # each answered turn asked once with success
    pending = sum(s == "pending" for s in status.values())
    assert f"dataset d: {pending} items not sent: they wait for an earlier turn" in res.stdout
    # The next run retries the failed turns, then sends the turns that waited for them.
    with sim_in_thread(SimConfig(seed=5, time_scale=0.0, log_bodies=True)) as sim:
        job = write_job(
            tmp_path,
            sim.base_url,
            datasets=[],
            concurrency=32,
            extra='[[datasets]]\nname = "d"\npath = "d.jsonl"\nmode = "sequential"\n',
        )
        res = run_cli("run", str(job))
        log = sim.simulator.chat_log()
    assert res.returncode == 0, res.stdout + res.stderr
    assert query(out, "SELECT COUNT(*) FROM items WHERE status != 'done'") == [(0,)]
    final = answers_by_turn(out)
    assert all(final[k] == v for k, v in results.items())  # nothing answered twice
    assert len(log) == 120 - len(results)
    for e in log:
        msgs = e.body["messages"]  # type: ignore[index]
        row = int(msgs[0]["content"].split()[0][1:])
        assert all(msgs[k]["content"] == final[(row, k)] for k in range(1, len(msgs), 2))


def test_inspect_shows_rows_their_requests_and_why_a_row_is_not_used(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    job = write_job(tmp_path, "http://127.0.0.1:9", datasets=[], extra=eight_families(tmp_path))
    res = run_cli("inspect", str(job), "--dataset", "B1", "--rows", "3", "--json")
    assert res.returncode == 0, res.stderr
    ins = json.loads(res.stdout)
    assert (ins["format"], ins["mode"]) == ("glaive", "each_turn")
    assert [r["row_index"] for r in ins["rows"]] == [0, 1, 2]
    first = ins["rows"][0]
    assert [q["turn_index"] for q in first["requests"]] == [2, 4, 6]
    body = first["requests"][1]["body"]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert [t["function"]["name"] for t in body["tools"]] == ["convert_currency", "get_weather"]
    assert body["max_tokens"] == 512 and body["model"] == "moonshotai/kimi-k2.5"
    assert ins["rows"][2]["requests"] == []
    assert "not valid JSON" in ins["rows"][2]["reason"]
    # Sequential: the later turn is shown waiting, with a placeholder for the earlier answer.
    res = run_cli("inspect", str(job), "--dataset", "B6", "--rows", "1")
    assert res.returncode == 0, res.stderr
    assert "sent after turn 1 is answered" in res.stdout
    assert "<regenerated answer of turn 1>" in res.stdout
    res = run_cli("inspect", str(job), "--dataset", "B9")
    assert res.returncode == 1
    assert res.stderr.strip().startswith("error: no dataset 'B9' in the job (datasets: B1,")
    assert not (tmp_path / "out").exists()  # inspect reads the source only


@pytest.mark.parametrize("damage", ["garbage", "wrong_format"])
def test_a_dataset_none_of_whose_rows_can_be_used_is_an_error(tmp_path: Path, damage: str) -> None:
    """All rows bad used to be "nothing to send" and exit 0."""
    path = tmp_path / "d.jsonl"
    if damage == "garbage":
        path.write_bytes(bytes(range(256)) * 8 + b"\n" + b"\xff\xfe\x00garbage\n")
        fmt = "openai"
    else:
        rows = [{"conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(5)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        fmt = "alpaca"
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("d", "d.jsonl", fmt)])
        res = run_cli("run", str(job))
        sent = len(sim.simulator.chat_log())
    assert res.returncode == 1 and sent == 0, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: dataset d: none of the ") and str(path) in line, line
    assert "row 0: " in line and f'check its format (now "{fmt}")' in line
    assert "regen inspect JOB --dataset d" in line


def test_auto_stops_on_a_row_that_fits_two_formats(tmp_path: Path) -> None:
    row = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "instruction": "q",
    }
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    job = write_job(tmp_path, "http://127.0.0.1:9/api/v1", datasets=[("d", "d.jsonl", "auto")])
    res = run_cli("run", str(job))
    assert res.returncode == 1
    (line,) = res.stderr.strip().splitlines()
    assert "fit formats openai and alpaca; set format = one of them" in line, line


def test_notes_on_rows_used_reach_inspect_the_summary_and_status(tmp_path: Path) -> None:
    """Real glaive row shapes (tests/sources/fixtures/real): a call to an undeclared name is
    used and noted; a role marker inside a turn is a bad row with its reason."""
    shapes = json.loads((Path(__file__).parent / "fixtures/real/glaive_shortened.json").read_text())
    by_row = {str(c["row"]): c for c in shapes}
    rows = [{k: by_row[n][k] for k in ("system", "chat")} for n in ("3871", "9046", "21816")]
    (tmp_path / "g.json").write_text(json.dumps(rows))
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url, datasets=[("g", "g.json", "glaive")])
        ins = json.loads(run_cli("inspect", str(job), "--dataset", "g", "--json").stdout)
        assert ins["rows"][0]["notes"] == [
            "calls functions it does not declare (create_to_do_list)"
        ]
        assert "FUNCTION RESPONSE holds <|endoftext|>" in ins["rows"][1]["reason"]
        res = run_cli("run", str(job))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "note: dataset g: 1 row(s) (rows 0): calls functions it does not declare" in res.stdout
    status = json.loads(run_cli("status", str(tmp_path / "out"), "--json").stdout)
    assert [g["rows"] for g in status["row_notes"]] == [1]
    assert "role marker inside the turn" in status["bad_row_reasons"][0]["example"]
