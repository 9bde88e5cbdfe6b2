"""state.db's schema: its migrations, in order, each applied once (schema_migrations)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from regen import __version__
from regen.conversation import estimate_prompt_tokens
from regen.errors import StateError
from regen.state.outstanding import m009_outstanding, m017_cut_short


def has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    """Whether a table has a column: readers open a state.db read-only and do not migrate
    it, so what a later migration added may not be there."""
    return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))


def _script(db: sqlite3.Connection, sql: str) -> None:
    # executescript() would COMMIT the migration's transaction half-way: run statements one by one.
    for statement in sql.split(";"):
        if statement.strip():
            db.execute(statement)


M001_SQL = """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE datasets (
            name TEXT PRIMARY KEY,
            position INTEGER NOT NULL,
            source TEXT NOT NULL,
            rows_read INTEGER NOT NULL DEFAULT 0,
            bad_rows INTEGER NOT NULL DEFAULT 0,
            turns_read INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE bad_rows (
            dataset TEXT NOT NULL,
            row_index INTEGER NOT NULL,
            reason TEXT NOT NULL,
            PRIMARY KEY (dataset, row_index)
        );
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            dataset TEXT NOT NULL,
            row_index INTEGER NOT NULL,
            data TEXT NOT NULL
        );
        CREATE TABLE items (
            id TEXT PRIMARY KEY,
            dataset TEXT NOT NULL,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            turn_index INTEGER NOT NULL,
            prompt_hash TEXT NOT NULL,
            order_key INTEGER NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'done', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            failure_class TEXT,
            failure_message TEXT,
            updated_at REAL
        );
        CREATE INDEX items_dispatch ON items (dataset, status, order_key);
        -- Identical prompts within a dataset are sent once: the first row that has it wins.
        CREATE UNIQUE INDEX items_prompt ON items (dataset, prompt_hash);
        CREATE TABLE results (
            item_id TEXT PRIMARY KEY REFERENCES items(id),
            dataset TEXT NOT NULL,
            content TEXT NOT NULL,
            reasoning TEXT,
            tool_calls TEXT,
            finish_reason TEXT,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            reasoning_tokens INTEGER NOT NULL,
            cost_usd REAL,
            provider TEXT,
            model TEXT,
            generation_id TEXT,
            latency_s REAL NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX results_dataset ON results (dataset);
        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL REFERENCES items(id),
            number INTEGER NOT NULL,
            started_at REAL NOT NULL,
            latency_s REAL NOT NULL,
            status INTEGER,
            failure_class TEXT,
            message TEXT,
            provider TEXT,
            generation_id TEXT
        );
        CREATE INDEX attempts_item ON attempts (item_id);
        CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL REFERENCES items(id),
            dataset TEXT NOT NULL,
            kind TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            cost_usd REAL,
            created_at REAL NOT NULL
        );
        CREATE INDEX ledger_dataset ON ledger (dataset);
        """
"""m001's tables and indexes, as first released (the text stays as it was)."""


def m001_initial(db: sqlite3.Connection) -> None:
    """The first schema: datasets, their rows and items, results, attempts, the ledger."""
    _script(db, M001_SQL)


def m002_lanes(db: sqlite3.Connection) -> None:
    """Lanes: each pending item is assigned to a lane at the start of a run; an estimate of its
    prompt tokens lets lanes select by size; escalated items keep the lane they moved to."""
    _script(
        db,
        """
        ALTER TABLE items ADD COLUMN lane TEXT;
        ALTER TABLE items ADD COLUMN prompt_tokens_est INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE items ADD COLUMN escalated INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX items_lane ON items (lane, dataset, status, escalated, order_key)
        """,
    )
    rows = db.execute(
        "SELECT i.id, i.turn_index, c.data FROM items i "
        "JOIN conversations c ON c.id = i.conversation_id"
    ).fetchall()
    db.executemany(
        "UPDATE items SET prompt_tokens_est = ? WHERE id = ?",
        [(estimate_prompt_tokens(json.loads(data), turn), iid) for iid, turn, data in rows],
    )


def m003_ledger_sources(db: sqlite3.Connection) -> None:
    """Each charge names the endpoint that made it, the provider that served it and its
    generation id, so that the ledger can be reconciled with an account's usage. Charges made
    before keep a null endpoint; their provider and generation id come from their results."""
    _script(
        db,
        """
        ALTER TABLE ledger ADD COLUMN endpoint TEXT;
        ALTER TABLE ledger ADD COLUMN provider TEXT;
        ALTER TABLE ledger ADD COLUMN generation_id TEXT;
        UPDATE ledger SET
            provider = (SELECT r.provider FROM results r WHERE r.item_id = ledger.item_id),
            generation_id = (SELECT r.generation_id FROM results r WHERE r.item_id = ledger.item_id)
        WHERE kind = 'completion'
        """,
    )


def m004_sources(db: sqlite3.Connection) -> None:
    """Sources: the format a dataset was read as (the detected one for `auto`) and the rows
    its filter or sample left out; in sequential mode an item waits for the item of the
    conversation's previous turn (`after_item`) to be done."""
    _script(
        db,
        """
        ALTER TABLE datasets ADD COLUMN format TEXT;
        ALTER TABLE datasets ADD COLUMN skipped_rows INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE items ADD COLUMN after_item TEXT;
        CREATE INDEX items_after ON items (after_item) WHERE after_item IS NOT NULL
        """,
    )


def m005_token_ids(db: sqlite3.Connection) -> None:
    """Exact token ids of prompt and answer, from servers that return them (vLLM, SGLang):
    little-endian uint32 arrays (pack_ids), NULL where the server gave none."""
    _script(
        db,
        """
        ALTER TABLE results ADD COLUMN prompt_token_ids BLOB;
        ALTER TABLE results ADD COLUMN completion_token_ids BLOB
        """,
    )


def m006_usage_source(db: sqlite3.Connection) -> None:
    """Where an answer's token counts come from when the server sent no usage: `ids` (counted
    from its token ids) or `estimate` (from the text); NULL: the server's usage."""
    _script(db, "ALTER TABLE results ADD COLUMN usage_source TEXT")


def m007_runs(db: sqlite3.Connection) -> None:
    """Runs and their timeline: when each run (or pilot) started and ended, with the job's
    dollar cap and the lanes' settings then; about once a second, each lane's requests on the
    wire and adaptive limit; and the lane each attempt went out on and each charge was made
    in. The report draws a job's history from these, and `regen plan` measures each lane from
    them, with the limit a provider let the lane settle at."""
    _script(
        db,
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL CHECK (kind IN ('run', 'pilot')),
            started_at REAL NOT NULL,
            ended_at REAL,
            stop_reason TEXT,
            max_cost_usd REAL,
            lanes TEXT NOT NULL
        );
        CREATE TABLE timeline (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            t REAL NOT NULL,
            lane TEXT NOT NULL,
            in_flight INTEGER NOT NULL,
            limit_now INTEGER NOT NULL,
            concurrency INTEGER NOT NULL
        );
        CREATE INDEX timeline_run ON timeline (run_id, t);
        ALTER TABLE attempts ADD COLUMN lane TEXT;
        ALTER TABLE ledger ADD COLUMN lane TEXT
        """,
    )


def m008_startup_indexes(db: sqlite3.Connection) -> None:
    """What a run reads before its first request comes from indexes alone. items_lane ends
    with the prompt-token estimate: summing the pending items' estimates per (lane, dataset)
    read each item from the table, 2.5 s at a million items. Failed items, and pending items
    escalated to a lane, have partial indexes of their own: re-queueing transient failures and
    returning escalated items of a lane gone from the job read every item. The ledger's
    answers per lane and totals per dataset are read from indexes a third of its rows' size
    (0.24 and 0.1 s a run at half a million charges, against 0.06 each)."""
    # As DEFERRED_INDEXES has it, to the letter: a read into an empty table drops and builds it.
    db.execute("DROP INDEX IF EXISTS items_lane")
    db.execute(
        "CREATE INDEX items_lane ON items "
        "(lane, dataset, status, escalated, order_key, prompt_tokens_est)"
    )
    _script(
        db,
        """
        CREATE INDEX items_failed ON items (failure_class) WHERE status = 'failed';
        CREATE INDEX items_escalated ON items (lane) WHERE status = 'pending' AND escalated = 1;
        DROP INDEX ledger_dataset;
        CREATE INDEX ledger_dataset ON ledger
            (dataset, prompt_tokens, completion_tokens, cost_usd);
        CREATE INDEX ledger_lane ON ledger (lane, dataset, kind)
        """,
    )


def m010_provenance(db: sqlite3.Connection) -> None:
    """Where each answer came from: the source row's own id (a batch file's `custom_id`, a
    ShareGPT or hub `id`), the mode the dataset's turns were chosen by, and per answer the
    run that stored it, the job's endpoint that answered and the settings its request
    carried (canonical JSON: what the body held besides the messages and tools). Rows read
    before keep a null id; answers stored before keep null provenance. `row_notes`: what a
    read noticed in a row it still used (calls to undeclared functions, assistant turns kept
    as context, a system prompt asking for visible reasoning), reported like bad rows."""
    _script(
        db,
        """
        ALTER TABLE conversations ADD COLUMN source_id TEXT;
        ALTER TABLE datasets ADD COLUMN mode TEXT;
        ALTER TABLE results ADD COLUMN run_id INTEGER;
        ALTER TABLE results ADD COLUMN endpoint TEXT;
        ALTER TABLE results ADD COLUMN settings TEXT;
        CREATE TABLE row_notes (
            dataset TEXT NOT NULL,
            row_index INTEGER NOT NULL,
            note TEXT NOT NULL,
            PRIMARY KEY (dataset, row_index, note)
        )
        """,
    )


def m011_samples(db: sqlite3.Connection) -> None:
    """Several answers per prompt: each item is one sample of its turn (0 for the first, which
    keeps the id and prompt key an item had before)."""
    _script(db, "ALTER TABLE items ADD COLUMN sample INTEGER NOT NULL DEFAULT 0")


def m012_outages(db: sqlite3.Connection) -> None:
    """Each time a run took an endpoint out of its pool (its server down or loading): from
    when until when, and how many requests went elsewhere meanwhile. Failed requests are in
    `attempts`, now with the endpoint each went to; an outage is one event however many
    requests it failed."""
    _script(
        db,
        """
        ALTER TABLE attempts ADD COLUMN endpoint TEXT;
        CREATE TABLE outages (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            endpoint TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL,
            resent INTEGER NOT NULL,
            PRIMARY KEY (run_id, endpoint, started_at)
        )
        """,
    )


def m013_source_view(db: sqlite3.Connection) -> None:
    """Which items their dataset's latest complete read still yields: `gone` is 1 for an item
    whose row (or turn) that read no longer found. Such an item is never sent, counts in no
    dataset's progress, and its answer stays in state.db but out of exports unless asked.
    Items read before are all in view until their dataset is next read in full. The partial
    index holds only the items gone, so that every count can leave them out from indexes."""
    _script(
        db,
        """
        ALTER TABLE items ADD COLUMN gone INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX items_gone ON items (dataset, status, lane, prompt_tokens_est)
            WHERE gone = 1
        """,
    )


def m014_run_ends(db: sqlite3.Connection) -> None:
    """How each run ended: `end_kind` (finished, budgets met, cap, outage, interrupted, pilot
    bound, stopped; NULL while it runs or when it was killed) and the exit code its command
    returned (NULL: not known, as for a pilot or a killed run)."""
    _script(
        db,
        """
        ALTER TABLE runs ADD COLUMN end_kind TEXT;
        ALTER TABLE runs ADD COLUMN exit_code INTEGER
        """,
    )


def m015_cache_use(db: sqlite3.Connection) -> None:
    """Each answer's and charge's prompt cache use: of its prompt tokens, those read from the
    provider's cache (`cached_tokens`, billed at its cache read price) and those written to it
    where writes are billed apart (`cache_write_tokens`). 0 for what was stored before."""
    _script(
        db,
        """
        ALTER TABLE results ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE results ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE ledger ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE ledger ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0
        """,
    )


def m016_pilot_key(db: sqlite3.Connection) -> None:
    """Each item's own place in its dataset's seeded shuffle (`pilot_key`), apart from its
    dispatch place (`order_key`, which keeps a conversation's items together): a pilot takes
    its items by it, so that its sample is spread over the conversations (its index is built
    by the first pilot, `Work.claim_batch`). Items stored before were dispatched in that
    shuffle: their order key is it."""
    _script(
        db,
        """
        ALTER TABLE items ADD COLUMN pilot_key INTEGER NOT NULL DEFAULT 0;
        UPDATE items SET pilot_key = order_key
        """,
    )


def m018_escalated_at(db: sqlite3.Connection) -> None:
    """When each escalated item was escalated (`escalated_at`, the commit's time): a lane hands
    out its escalated items in that order, the first escalated first, across restarts
    (`Work.claim_escalated`). Items escalated before it take their last update's time."""
    _script(
        db,
        """
        ALTER TABLE items ADD COLUMN escalated_at REAL;
        UPDATE items SET escalated_at = COALESCE(updated_at, 0) WHERE escalated = 1;
        CREATE INDEX items_escalated_order ON items (lane, escalated_at, order_key, id)
            WHERE status = 'pending' AND escalated = 1 AND gone = 0
        """,
    )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    m001_initial,
    m002_lanes,
    m003_ledger_sources,
    m004_sources,
    m005_token_ids,
    m006_usage_source,
    m007_runs,
    m008_startup_indexes,
    m009_outstanding,
    m010_provenance,
    m011_samples,
    m012_outages,
    m013_source_view,
    m014_run_ends,
    m015_cache_use,
    m016_pilot_key,
    m017_cut_short,
    m018_escalated_at,
]


Recorded = Literal["runs", "held", "row_notes", "answer_endpoints", "outages", "cache_use"]
"""What a state.db may be too old to hold: readers ask `Store.records(what)` rather than
compare version numbers, so that the numbers live here only."""

RECORDED_SINCE: dict[Recorded, Callable[[sqlite3.Connection], None]] = {
    "runs": m007_runs,  # runs, timeline, and the lane of attempts and charges
    "held": m009_outstanding,  # requests sent and not yet billed, per run
    "row_notes": m010_provenance,  # what a read noticed in rows it used
    "answer_endpoints": m010_provenance,  # each answer's endpoint, run and settings
    "outages": m012_outages,  # outages, and the endpoint of each attempt
    "cache_use": m015_cache_use,  # cached and written prompt tokens of answers and charges
}


def records(db: sqlite3.Connection, what: Recorded) -> bool:
    """Whether this state.db's schema holds `what` (see RECORDED_SINCE)."""
    return stored_version(db) >= MIGRATIONS.index(RECORDED_SINCE[what]) + 1


def stored_version(db: sqlite3.Connection) -> int:
    """The newest migration a state.db records (0 for a new file), read without writing."""
    known = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if known is None:
        return 0
    (v,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(v)


def refuse_unknown_schema(db: sqlite3.Connection, path: Path) -> None:
    """Every command's one check, before it reads or writes anything else: a state.db whose
    schema is newer than this regen's migrations may hold tables and columns this regen would
    not keep (or would write wrongly), so it is refused."""
    version = stored_version(db)
    if version > len(MIGRATIONS):
        raise StateError(
            f"{path}: its schema is version {version}, written by a newer regen; this regen "
            f"({__version__}) knows versions up to {len(MIGRATIONS)} and changed nothing in "
            "it: use the regen that wrote it (or a later one)"
        )
