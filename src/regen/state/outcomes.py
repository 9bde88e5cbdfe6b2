"""The rows one commit of finished items writes, table by table: built here from the
scheduler's outcomes and charges, written by each table's owner in the Store's one
transaction (Store.commit_outcomes)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from regen.conversation import Attempt, Charge, Outcome, Result, Usage
from regen.safe import printable, redact
from regen.state.answers import pack_ids
from regen.state.owner import Rows


@dataclass(slots=True)
class OutcomeRows:
    """Each table's rows of one commit."""

    attempts: Rows = field(default_factory=list)
    ledger: Rows = field(default_factory=list)
    results: Rows = field(default_factory=list)
    done: Rows = field(default_factory=list)
    """Items answered: (attempts, now, id)."""
    moved: Rows = field(default_factory=list)
    """Items whose truncated answer goes on to a longer lane: (attempts, lane, now, id)."""
    touched: Rows = field(default_factory=list)
    """Items abandoned when the run stopped, pending still: (attempts, now, id)."""
    failures: Rows = field(default_factory=list)
    """Items failed for good: (attempts, class, message, now, id)."""


def outcome_rows(outcomes: Iterable[Outcome], charges: Iterable[Charge], now: float) -> OutcomeRows:
    """The rows that record finished items (each one's result or failure, attempts and ledger
    charge) and charges learnt after the fact (`Charge.kind`)."""
    rows = OutcomeRows()
    for o in outcomes:
        rows.attempts.extend(_attempt_row(o.item_id, a) for a in o.attempts)
        r = o.result
        if r is not None:
            # Every answer is charged, a truncated one that moves on to another lane too.
            rows.ledger.append(_answer_charge_row(o, r, now))
        if o.escalate_to is not None and r is not None:
            rows.moved.append((len(o.attempts), o.escalate_to, now, o.item_id))
        elif o.abandoned:
            rows.touched.append((len(o.attempts), now, o.item_id))
        elif r is not None:
            rows.results.append(_result_row(o, r, now))
            rows.done.append((len(o.attempts), now, o.item_id))
        else:
            rows.failures.append(
                (len(o.attempts), o.failure_class, _shown(o.failure_message), now, o.item_id)
            )
    rows.ledger.extend(_charge_row(c, now) for c in charges)
    return rows


def _attempt_row(item_id: str, a: Attempt) -> tuple[Any, ...]:
    """An attempts row: how one attempt went, the server's words shown safely."""
    return (
        item_id,
        a.number,
        a.started_at,
        a.latency_s,
        a.status,
        a.failure_class,
        _shown(a.message),
        _shown(a.provider),
        _shown(a.generation_id),
        a.lane,
        a.endpoint,
    )


def _answer_charge_row(o: Outcome, r: Result, now: float) -> tuple[Any, ...]:
    """The ledger row of an answer: `completion`, or `escalated` for one whose item goes on
    to a longer lane."""
    u = r.usage
    return (
        r.item_id,
        o.dataset,
        "completion" if o.escalate_to is None else "escalated",
        u.prompt_tokens,
        u.completion_tokens,
        u.cost_usd,
        now,
        r.endpoint,
        _shown(r.provider),
        _shown(r.generation_id),
        o.attempts[-1].lane if o.attempts else None,
    )


def _result_row(o: Outcome, r: Result, now: float) -> tuple[Any, ...]:
    """A results row: the answer, its usage, and its exact ids packed."""
    u = r.usage
    m = r.message
    calls = json.dumps([tc.to_openai() for tc in m.tool_calls]) if m.tool_calls else None
    # The answer stays as the model wrote it, but for a key a server echoed into it.
    return (
        r.item_id,
        o.dataset,
        redact(m.content),
        None if m.reasoning is None else redact(m.reasoning),
        None if calls is None else redact(calls),
        _shown(r.finish_reason),
        u.prompt_tokens,
        u.completion_tokens,
        u.reasoning_tokens,
        u.cost_usd,
        _shown(r.provider),
        _shown(r.model),
        _shown(r.generation_id),
        r.latency_s,
        now,
        pack_ids(r.prompt_token_ids),
        pack_ids(r.completion_token_ids),
        None if u.source == "server" else u.source,
        r.endpoint,
        r.settings,
    )


def _charge_row(c: Charge, now: float) -> tuple[Any, ...]:
    """The ledger row of a charge learnt after the fact."""
    u = c.usage
    return (
        c.item_id,
        c.dataset,
        c.kind,
        u.prompt_tokens,
        u.completion_tokens,
        u.cost_usd,
        now,
        c.endpoint,
        _shown(c.provider),
        _shown(c.generation_id),
        c.lane,
    )


def _shown(text: str | None) -> str | None:
    """A server's word kept to be shown (an error message, a provider name, an id): keys
    redacted and control characters escaped (safe.printable), so no view of state.db can
    leak a key or carry a terminal escape."""
    return None if text is None else printable(text)


def with_cache_use(
    rows: OutcomeRows, outcomes: Sequence[Outcome], charges: Sequence[Charge]
) -> OutcomeRows:
    """The rows with each charge's and answer's cached and written prompt tokens appended
    (ledger and results rows, in the order outcome_rows builds them: each outcome's answer,
    then the charges), checked item by item."""
    charged = [(o.item_id, o.result.usage) for o in outcomes if o.result is not None]
    charged += [(c.item_id, c.usage) for c in charges]
    stored = [
        (o.item_id, o.result.usage)
        for o in outcomes
        if o.result is not None and o.escalate_to is None and not o.abandoned
    ]
    rows.ledger = _cache_columns(rows.ledger, charged)
    rows.results = _cache_columns(rows.results, stored)
    return rows


def _cache_columns(table: Rows, usages: list[tuple[str, Usage]]) -> Rows:
    """Each row (whose first column is its item) with its usage's cache use appended."""
    if len(table) != len(usages) or any(
        row[0] != item for row, (item, _) in zip(table, usages, strict=True)
    ):
        raise AssertionError("cache use: the rows do not match the outcomes")
    return [
        (*row, u.cached_tokens, u.cache_write_tokens)
        for row, (_, u) in zip(table, usages, strict=True)
    ]
