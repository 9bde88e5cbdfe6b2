"""`regen audit OUT`: do the reconstructed completions match what the provider billed, and is
every answer well formed?

Per dataset: the mean and max absolute difference between the reconstructed completion's
length and the billed `completion_tokens`, the share of exact matches, the worst samples; and
structural checks: reasoning present where expected, no stray markers in content, tool-call
names among the declared tools, arguments that are valid JSON, finish reasons. Answers that
came with exact ids (vLLM/SGLang `token_ids`) are checked as they are.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.reconstruct import STRAY_MARKERS, completion_ids, load_tokenizer
from regen.store import Store, unpack_ids


@dataclass
class DatasetAudit:
    name: str
    samples: int = 0
    truncated: int = 0
    """Answers cut at max_tokens, left out of the length statistics unless asked for: exports
    drop them by default, and a cut inside a tool call loses text the server's parser drops."""
    exact_ids: int = 0
    abs_diff_sum: int = 0
    max_abs_diff: int = 0
    matches: int = 0
    worst: list[tuple[int, str, int, int]] = field(default_factory=list)
    """(abs diff, item id, reconstructed, billed), largest first."""
    problems: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def mean_abs_diff(self) -> float:
        return self.abs_diff_sum / self.samples if self.samples else 0.0

    @property
    def match_share(self) -> float:
        return self.matches / self.samples if self.samples else 0.0


def _structure(
    reasoning: str | None,
    content: str,
    calls: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    expect_reasoning: bool,
    finish: str | None,
) -> list[str]:
    problems = []
    if expect_reasoning and not reasoning and finish != "length":
        problems.append("no_reasoning")
    if any(m in content for m in STRAY_MARKERS):
        problems.append("stray_marker_in_content")
    declared = {(t.get("function") or {}).get("name") for t in tools}
    for c in calls:
        fn = c.get("function") or {}
        if tools and fn.get("name") not in declared:
            problems.append("undeclared_tool")
        try:
            json.loads(fn.get("arguments") or "")
        except (json.JSONDecodeError, TypeError):
            problems.append("arguments_not_json")
    return problems


def audit(
    out: Path,
    family: str,
    tokenizer: str,
    *,
    expect_reasoning: bool = False,
    include_truncated: bool = False,
    worst: int = 5,
) -> list[DatasetAudit]:
    tok = load_tokenizer(tokenizer)
    store = Store.open_readonly(out)
    try:
        names = [p.name for p in store.dataset_progress()]
        audits = {n: DatasetAudit(n) for n in names}
        for name in names:
            a = audits[name]
            for row in store.export_rows(name):
                a.finish_reasons[row.finish_reason or "none"] += 1
                if row.finish_reason == "length" and not include_truncated:
                    a.truncated += 1
                    continue
                a.samples += 1
                exact = unpack_ids(row.completion_token_ids)
                if exact is not None:
                    a.exact_ids += 1
                    ids = exact
                else:
                    ids = completion_ids(
                        tok, family, row.reasoning, row.content, row.tool_calls, row.finish_reason
                    )
                diff = abs(len(ids) - row.completion_tokens)
                a.abs_diff_sum += diff
                a.max_abs_diff = max(a.max_abs_diff, diff)
                a.matches += diff == 0
                a.worst.append((diff, row.item_id, len(ids), row.completion_tokens))
                a.worst = sorted(a.worst, reverse=True)[:worst]
                tools = row.conversation.get("tools") or []
                for p in _structure(
                    row.reasoning,
                    row.content,
                    row.tool_calls,
                    tools,
                    expect_reasoning,
                    row.finish_reason,
                ):
                    a.problems[p] += 1
    finally:
        store.close()
    return list(audits.values())


def audit_json(audits: list[DatasetAudit]) -> dict[str, Any]:
    total = DatasetAudit("all")
    for a in audits:
        total.samples += a.samples
        total.abs_diff_sum += a.abs_diff_sum
        total.max_abs_diff = max(total.max_abs_diff, a.max_abs_diff)
        total.matches += a.matches
        total.exact_ids += a.exact_ids
        total.truncated += a.truncated
        total.problems.update(a.problems)
        total.finish_reasons.update(a.finish_reasons)
    return {
        "datasets": [_one(a) for a in audits],
        "overall": _one(total),
    }


def _one(a: DatasetAudit) -> dict[str, Any]:
    return {
        "name": a.name,
        "samples": a.samples,
        "truncated_left_out": a.truncated,
        "exact_ids": a.exact_ids,
        "mean_abs_diff": round(a.mean_abs_diff, 4),
        "max_abs_diff": a.max_abs_diff,
        "match_share": round(a.match_share, 4),
        "worst": [
            {"abs_diff": d, "item_id": i, "reconstructed": r, "billed": b}
            for d, i, r, b in a.worst
            if d
        ],
        "problems": dict(sorted(a.problems.items())),
        "finish_reasons": dict(sorted(a.finish_reasons.items())),
    }
