from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from regen.conversation import Attempt, Conversation, Message, Outcome, Result, Usage
from regen.errors import StateError
from regen.sources.modes import item_id, prompt_hash
from regen.state.db import Store
from regen.state.schema import MIGRATIONS
from regen.state.work import NewConversation, NewItem


def conv(text: str, row: int = 0, answer: str = "a") -> Conversation:
    return Conversation("ds", row, (Message("user", text), Message("assistant", answer)))


def new(c: Conversation, key: int, est: int = 0) -> NewConversation:
    item = NewItem(item_id(c.id, 1), 1, prompt_hash(c, 1), key, est)
    return NewConversation(c.id, c.dataset, c.row_index, json.dumps(c.to_dict()), [item])


def add_first_release_item(store: Store, c: Conversation, iid: str, key: int) -> None:
    """A conversation and one item, written with only the columns of the first schema (for
    migration tests, where today's add_conversations would write columns not there yet)."""
    store.sources.register("ds", 0, "src")
    store._db.execute(
        "INSERT INTO conversations (id, dataset, row_index, data) VALUES (?, 'ds', 0, ?)",
        (c.id, json.dumps(c.to_dict())),
    )
    store._db.execute(
        "INSERT INTO items (id, dataset, conversation_id, turn_index, prompt_hash, order_key)"
        " VALUES (?, 'ds', ?, 1, 'h', ?)",
        (iid, c.id, key),
    )


def add(store: Store, c: Conversation, key: int) -> int:
    store.sources.register("ds", 0, "src")
    return store.work.add_conversations([new(c, key)])


def test_migrations_are_recorded_once(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    store = Store.open(tmp_path)
    assert store.schema_version() == len(MIGRATIONS)
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT version, name FROM schema_migrations").fetchall() == [
        (1, "m001_initial"),
        (2, "m002_lanes"),
        (3, "m003_ledger_sources"),
        (4, "m004_sources"),
        (5, "m005_token_ids"),
        (6, "m006_usage_source"),
        (7, "m007_runs"),
        (8, "m008_startup_indexes"),
        (9, "m009_outstanding"),
        (10, "m010_provenance"),
        (11, "m011_samples"),
        (12, "m012_outages"),
        (13, "m013_source_view"),
        (14, "m014_run_ends"),
        (15, "m015_cache_use"),
        (16, "m016_pilot_key"),
        (17, "m017_cut_short"),
        (18, "m018_escalated_at"),
    ]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_identical_prompts_are_one_item_and_rereads_add_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert add(store, conv("q", 0, "first answer"), 5) == 1
    assert add(store, conv("q", 1, "other answer"), 6) == 0  # same prompt, other row
    assert add(store, conv("q", 0, "first answer"), 5) == 0  # the same row read again
    assert add(store, conv("q2", 2), 7) == 1
    assert [p.items for p in store.work.dataset_progress()] == [2]


def test_claim_batch_walks_dispatch_order(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    for i, key in enumerate([30, 10, 20]):
        add(store, conv(f"q{i}", i), key)
    first = store.work.claim_batch("ds", -1, 2)
    assert [p.order_key for p in first] == [10, 20]
    assert first[0].conversation_id == conv("q1", 1).id  # the item with key 10
    assert [p.order_key for p in store.work.claim_batch("ds", 20, 2)] == [30]


def test_outcomes_commit_result_attempts_and_ledger_together(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    c1, c2 = conv("q1", 0), conv("q2", 1)
    add(store, c1, 1)
    add(store, c2, 2)
    i1, i2 = item_id(c1.id, 1), item_id(c2.id, 1)
    ok = Outcome(
        i1,
        "ds",
        (Attempt(1, 0.0, 0.1, 503, "overloaded", "busy"), Attempt(2, 0.0, 0.2, 200)),
        result=Result(i1, Message("assistant", "new"), "stop", Usage(10, 20, 5, 0.5)),
    )
    bad = Outcome(
        i2,
        "ds",
        (Attempt(1, 0.0, 0.1, 400, "bad_request", "no"),),
        failure_class="bad_request",
        failure_message="no",
    )
    store.commit_outcomes([ok, bad])
    (p,) = store.work.dataset_progress()
    assert (p.done, p.failed, p.prompt_tokens, p.completion_tokens, p.cost_usd) == (
        1,
        1,
        10,
        20,
        0.5,
    )
    assert store.spend.failure_counts() == {("ds", "overloaded"): 1, ("ds", "bad_request"): 1}
    (row,) = store.answers.export_rows("ds")
    assert (row.item_id, row.content) == (i1, "new")
    with pytest.raises(StateError):  # a second commit of the same result is refused whole
        store.commit_outcomes([ok])
    assert store.work.dataset_progress()[0].done == 1
    assert len(store.spend.failure_counts()) == 2


def test_unwritable_output_dir_is_a_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot create output directory"):
        Store.open(blocker / "out")


def test_m002_upgrades_a_database_made_by_m001(tmp_path: Path) -> None:
    from regen.state import db as store_mod

    old = store_mod.MIGRATIONS
    store_mod.MIGRATIONS = old[:1]  # the schema as the first release made it
    try:
        s1 = Store.open(tmp_path)
        c = conv("a question of forty characters, roughly!", 0)
        add_first_release_item(s1, c, "i1", 5)
        s1.close()
    finally:
        store_mod.MIGRATIONS = old
    s2 = Store.open(tmp_path)
    assert s2.schema_version() == len(MIGRATIONS)
    row = s2._db.execute("SELECT lane, escalated, prompt_tokens_est FROM items").fetchone()
    assert row == (None, 0, c.estimate_prompt_tokens(1)) and row[2] > 10


def test_m009_holds_an_older_states_exposure_for_the_whole_job(tmp_path: Path) -> None:
    """An older regen kept one number for what a killed run's requests might still cost
    (`exposure_usd` in meta, with the holds it inherited): each becomes one request held
    against the job alone, until its time, and the number goes."""
    import json

    from regen.state import db as store_mod

    old = store_mod.MIGRATIONS
    store_mod.MIGRATIONS = old[:8]
    try:
        s1 = Store.open(tmp_path)
        exposure = {"usd": 0.25, "at": 1000.0, "pid": 7, "holds": [{"usd": 0.5, "until": 2000.0}]}
        s1.set_meta("exposure_usd", json.dumps(exposure))
        s1.close()
    finally:
        store_mod.MIGRATIONS = old
    s2 = Store.open(tmp_path)
    held = sorted((r.dataset, r.worst_usd, r.deadline) for r in s2.outstanding.all())
    assert held == [(None, 0.25, 4600.0), (None, 0.5, 2000.0)]
    assert s2.get_meta("exposure_usd") is None
    assert s2.outstanding.held() == (2, 0.75, 4600.0)


def test_outstanding_requests_leave_with_the_commit_of_their_bills(tmp_path: Path) -> None:
    """A request is written before it is sent, named by its generation id when the response
    says it, and leaves in the transaction that commits its bill: a kill at any moment leaves
    either its bill in the ledger or the request outstanding, never both and never neither."""
    from regen.state.outstanding import Sent

    store = Store.open(tmp_path)
    c = conv("q", 0)
    add(store, c, 1)
    iid = item_id(c.id, 1)
    sent = [Sent(k, 1, iid, "ds", "lane", "default", 0.01, 50.0, 10.0, 99.0) for k in (1, 2)]
    store.outstanding.write(sent, [(1, "gen-1")])
    assert [(r.id, r.generation_id) for r in store.outstanding.all()] == [(1, "gen-1"), (2, None)]
    result = Result(
        iid, Message("assistant", "a"), "stop", Usage(1, 2, 0, 0.005), generation_id="gen-1"
    )
    store.commit_outcomes(
        [Outcome(iid, "ds", (Attempt(1, 0.0, 0.1, 200),), result=result)], (), [1]
    )
    assert [r.id for r in store.outstanding.all()] == [2]
    assert store.outstanding.held(live_run=1) == (0, 0.0, None)  # the live run's own
    assert store.outstanding.held() == (1, 0.01, 99.0)


def test_assign_lanes_takes_the_first_lane_that_selects(tmp_path: Path) -> None:
    from regen.state.work import LaneRule

    store = Store.open(tmp_path)
    short, long_ = conv("q", 0), conv("q" * 4000, 1)
    add(store, short, 1)
    store.work.add_conversations([new(long_, 2, long_.estimate_prompt_tokens(1))])
    unassigned = store.work.assign_lanes(
        [LaneRule("small", max_prompt_tokens=100), LaneRule("big")]
    )
    assert unassigned == {}
    assert [i.id for i in store.work.claim_batch("ds", -1, 10, lane="big")] == [
        item_id(long_.id, 1)
    ]
    assert [i.id for i in store.work.claim_batch("ds", -1, 10, lane="small")] == [
        item_id(short.id, 1)
    ]
    unassigned = store.work.assign_lanes([LaneRule("only-other", datasets=["other"])])
    assert unassigned == {"ds": 2}


def test_m003_upgrades_a_database_made_by_m002_and_keeps_its_charges(tmp_path: Path) -> None:
    from regen.state import db as store_mod

    old = store_mod.MIGRATIONS
    store_mod.MIGRATIONS = old[:2]  # the schema as m002 left it
    try:
        s1 = Store.open(tmp_path)
        c = conv("q", 0)
        iid = item_id(c.id, 1)
        add_first_release_item(s1, c, iid, 1)
        s1._db.execute(
            "INSERT INTO results VALUES (?, 'ds', 'a', NULL, NULL, 'stop', 3, 4, 0, 0.25, "
            "'DeepInfra', 'm', 'gen-1', 0.1, 0)",
            (iid,),
        )
        s1._db.execute(
            "INSERT INTO ledger (item_id, dataset, kind, prompt_tokens, completion_tokens, "
            "cost_usd, created_at) VALUES (?, 'ds', 'completion', 3, 4, 0.25, 0)",
            (iid,),
        )
        s1.close()
    finally:
        store_mod.MIGRATIONS = old
    s2 = Store.open(tmp_path)
    assert s2.schema_version() == len(MIGRATIONS)
    row = s2._db.execute("SELECT endpoint, provider, generation_id, cost_usd FROM ledger")
    assert row.fetchall() == [(None, "DeepInfra", "gen-1", 0.25)]
    assert s2.work.dataset_progress()[0].cost_usd == 0.25
    # A charge made before endpoints were recorded belongs to no account.
    assert s2.spend.ledger_usd(["default"]) == 0.0


def test_ledger_charges_name_their_endpoint_provider_and_generation(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    c = conv("q", 0)
    add(store, c, 1)
    iid = item_id(c.id, 1)
    result = Result(
        iid,
        Message("assistant", "a"),
        "stop",
        Usage(1, 2, 0, 0.125),
        provider="Fireworks",
        generation_id="gen-9",
        endpoint="local-1",
    )
    store.commit_outcomes([Outcome(iid, "ds", (Attempt(1, 0.0, 0.1, 200),), result=result)])
    row = store._db.execute("SELECT endpoint, provider, generation_id FROM ledger").fetchone()
    assert row == ("local-1", "Fireworks", "gen-9")
    assert store.spend.ledger_usd(["local-1", "other"]) == 0.125
    assert store.spend.ledger_usd(["other"]) == 0.0


def test_rows_sorted_before_they_go_in_still_keep_the_first_of_each_key(tmp_path: Path) -> None:
    """Rows go into the tables sorted by key, a few at a time: of two conversations with one
    id, or two items with one prompt, the earlier in the source still wins, within a sorted
    group and across groups."""
    store = Store.open(tmp_path)
    store.sources.register("ds", 0, "src")

    def row(cid: str, index: int, item: str, prompt: str) -> NewConversation:
        return NewConversation(cid, "ds", index, "{}", [NewItem(item, 1, prompt, index)])

    source = [
        row("c9", 0, "i9", "p"),  # the prompt `p` first, under the largest ids
        row("c1", 1, "i1", "p"),
        row("c5", 2, "i5", "q"),
        row("c5", 3, "i5", "q"),  # the same row again, later
        row("c0", 4, "i0", "p"),  # in the next sorted group
    ]
    added = store.work.add_conversation_batches(([r] for r in source), commit_rows=10, sort_rows=4)
    assert added == 2
    items = store._db.execute("SELECT id, prompt_hash FROM items ORDER BY id").fetchall()
    assert items == [("i5", "q"), ("i9", "p")]
    convs = store._db.execute("SELECT id, row_index FROM conversations ORDER BY id").fetchall()
    assert convs == [("c0", 4), ("c1", 1), ("c5", 2), ("c9", 0)]


def test_m013_upgrades_a_database_made_by_m012_with_every_item_in_view(tmp_path: Path) -> None:
    """Items read before m013 are all in view until their dataset's next complete read, and
    a reader that opens such a state.db read-only (it does not migrate) sees the same."""
    from regen.state import db as store_mod

    old = store_mod.MIGRATIONS
    store_mod.MIGRATIONS = old[:12]  # the schema as m012 left it
    try:
        s1 = Store.open(tmp_path)
        c1, c2 = conv("q1", 0), conv("q2", 1)
        add(s1, c1, 1)
        add(s1, c2, 2)
        i1 = item_id(c1.id, 1)
        answer = Result(i1, Message("assistant", "new"), "stop", Usage(10, 20, 5, 0.5))
        s1.commit_outcomes([Outcome(i1, "ds", (Attempt(1, 0.0, 0.1, 200),), result=answer)])
        s1.close()
    finally:
        store_mod.MIGRATIONS = old

    def in_view(store: Store) -> None:
        (p,) = store.work.dataset_progress()
        assert (p.items, p.done, p.pending, p.orphans) == (2, 1, 1, 0)
        (row,) = store.answers.export_rows("ds")
        assert (row.item_id, row.orphan) == (i1, False)
        assert [n for _, n in store.answers.counted_by("model", ["ds"])] == [1]
        assert store.work.pending_flows() == {(None, "ds"): (1, 0)}

    reader = Store.open_readonly(tmp_path)
    in_view(reader)
    reader.close()
    s2 = Store.open(tmp_path)
    assert s2.schema_version() == len(MIGRATIONS)
    assert s2._db.execute("SELECT gone, COUNT(*) FROM items GROUP BY gone").fetchall() == [(0, 2)]
    in_view(s2)
    s2._db.execute("UPDATE items SET gone = 1 WHERE id = ?", (i1,))
    (p,) = s2.work.dataset_progress()
    assert (p.items, p.done, p.pending, p.orphans) == (1, 0, 1, 1)
    (row,) = s2.answers.export_rows("ds")
    assert row.orphan
    assert s2.answers.counted_by("model", ["ds"]) == []
    assert [n for _, n in s2.answers.counted_by("model", ["ds"], orphans=True)] == [1]


def test_a_reader_asks_what_an_older_state_db_records(tmp_path: Path) -> None:
    """`Store.records` answers from the migration that added each thing, so that readers of an
    older state.db (status, the report) never compare version numbers themselves."""
    from regen.state.schema import RECORDED_SINCE

    for what, migration in RECORDED_SINCE.items():
        version = MIGRATIONS.index(migration) + 1
        for applied, expected in ((version - 1, False), (version, True)):
            out = tmp_path / f"{what}-{applied}"
            Store.open(out).close()
            db = sqlite3.connect(out / "state.db")
            with db:  # as a regen that knew only the first `applied` migrations left it
                db.execute("DELETE FROM schema_migrations WHERE version > ?", (applied,))
            db.close()
            store = Store.open_readonly(out)
            try:
                assert store.records(what) is expected, (what, applied)
            finally:
                store.close()


def test_escalated_items_are_claimed_in_the_order_they_were_escalated(tmp_path: Path) -> None:
    """A long lane's backlog is first in, first out: by the time each item was escalated
    (those of one commit in dispatch order), paged by keyset, whatever their order keys."""
    from regen.state.outcomes import OutcomeRows
    from regen.state.work import LaneRule, Work

    store = Store.open(tmp_path)
    ids = {}
    for key in (30, 20, 10, 40):
        c = conv(f"q{key}", key)
        add(store, c, key)
        ids[key] = item_id(c.id, 1)
    store.work.assign_lanes([LaneRule("short"), LaneRule("long", datasets=[])])

    def escalate(at: float, *keys: int) -> None:
        with store._tx() as db:
            Work.finish_in(db, OutcomeRows(moved=[(1, "long", at, ids[k]) for k in keys]), [])

    escalate(1.0, 30)
    escalate(2.0, 20, 10)
    page = store.work.claim_escalated("long", 2)
    assert [i.id for i in page] == [ids[30], ids[10]]
    last = page[-1]
    cursor = (last.escalated_at, last.order_key, last.id)
    escalate(3.0, 40)  # escalated while the pass is under way: it comes after the rest
    assert [i.id for i in store.work.claim_escalated("long", 5, after=cursor)] == [
        ids[20],
        ids[40],
    ]
    # One with no time of escalation (a state.db written elsewhere) is not lost: the next
    # run's lanes put it first.
    store._db.execute("UPDATE items SET escalated_at = NULL WHERE id = ?", (ids[40],))
    assert ids[40] not in [i.id for i in store.work.claim_escalated("long", 5)]
    store.work.assign_lanes([LaneRule("short"), LaneRule("long", datasets=[])])
    assert store.work.claim_escalated("long", 1)[0].id == ids[40]
