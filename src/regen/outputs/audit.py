"""`regen audit OUT`: do the rebuilt ids match what the provider billed, and is every answer
well formed?

Per dataset and overall: the mean and max absolute difference between the rebuilt and the
billed completion tokens (and prompt tokens), the share of exact matches, the worst samples;
and structural checks: reasoning present where expected, no control markers in content or
reasoning, tool-call names among the declared tools, arguments that are JSON and valid against
the declared schema, a finish reason that fits the answer, no answer from an excluded
provider; and, without a rebuild, text far longer than its bill, and text that holds U+FFFD.
`regen export --drop-failed-audit` drops the samples these checks fail.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from regen.reconstruct import ReconstructError, Sample, Target, TargetSpec, spec_from_store
from regen.reconstruct.parse import LEGACY, first_difference, parse, server_form
from regen.state.answers import ExportRow, unpack_ids
from regen.state.db import Store

BATCH = 256
"""Answers rebuilt together (their texts are encoded in one batch)."""
TEXT_BYTES_PER_BILLED_TOKEN = 128
"""An answer whose text (content, reasoning, tool-call names and arguments) has more UTF-8
bytes than this per billed completion token is `text_long_for_bill`. No token of Qwen's or
DeepSeek's vocabularies is longer (honest text averages 3-5 bytes a token), so no honest answer
passes it, tokenizer or not; a server that sends what it did not bill for does. Smaller
mismatches are `length_off_billed`'s to find, by the rebuild."""
REPLACEMENT = "\ufffd"
"""Stands in for a code point the server sent that cannot be stored as text (a lone
surrogate, bytes that are not UTF-8), or one the server's own decoder gave up on: the text
lost a character (`replacement_character`)."""


@dataclass(frozen=True)
class Checks:
    """What counts as a failed sample."""

    expect_reasoning: bool = False
    max_sample_diff: int = 3
    """A completion whose rebuilt length is further than this from the billed count fails."""
    excluded_providers: frozenset[str] = frozenset()


@dataclass
class Diffs:
    """Rebuilt-minus-billed differences of one kind of token (prompt or completion)."""

    abs_sum: int = 0
    max_abs: int = 0
    matches: int = 0

    def add(self, diff: int) -> None:
        d = abs(diff)
        self.abs_sum += d
        self.max_abs = max(self.max_abs, d)
        self.matches += d == 0

    def merge(self, other: Diffs) -> None:
        self.abs_sum += other.abs_sum
        self.max_abs = max(self.max_abs, other.max_abs)
        self.matches += other.matches


@dataclass
class DatasetAudit:
    name: str
    samples: int = 0
    truncated: int = 0
    """Answers cut at max_tokens, left out unless asked for: exports drop them by default, and
    a cut inside a tool call loses text the server's parser drops."""
    exact_ids: int = 0
    completion: Diffs = field(default_factory=Diffs)
    prompt: Diffs = field(default_factory=Diffs)
    failed: int = 0
    """Samples with a structural problem or a completion difference over the limit."""
    worst: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    """(largest abs diff of completion or prompt, item id, rebuilt completion, billed
    completion, prompt diff), largest first."""
    failing: list[tuple[str, list[str], list[str]]] = field(default_factory=list)
    """(item id, problems, what each says of itself) of every sample that fails."""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(item id, what) of the first samples that pass with something said (text a server
    inserted that its ids do not hold)."""
    problems: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    reparse: list[tuple[str, str]] = field(default_factory=list)
    """(item id, why) of the first answers whose rebuild fails a check of its own: it cannot
    be built (the template cannot show it), loses part of the answer, or does not parse back
    to the stored answer."""
    oracle_checked: int = 0
    """Answers with the server's own ids that were also rebuilt from their text."""
    oracle_matches: int = 0
    """... whose rebuilt prompt and completion ids equal the server's, token for token."""
    oracle_divergences: list[tuple[str, str]] = field(default_factory=list)
    """(item id, first divergence) of the first that do not."""

    def per_sample(self, n: int) -> float:
        return n / self.samples if self.samples else 0.0

    def add(
        self,
        sample: Sample | ReconstructError,
        problems: list[str],
        keep_worst: int,
        reparse: str | None = None,
        oracle: str | None = None,
        failing: list[str] | None = None,
        details: list[str] | None = None,
    ) -> None:
        """Count one answer: its differences (none when it could not be rebuilt), problems,
        and how its rebuild compares with the server's ids where it has them. `failing`: the
        problems that fail it (all of `problems` unless given), named with `details`."""
        self.samples += 1
        failing = problems if failing is None else failing
        item = sample.item_id if isinstance(sample, Sample) else str(sample).partition(": ")[0]
        if failing:
            self.failing.append((item, failing, details or []))
        elif details and len(self.notes) < keep_worst:
            self.notes.append((item, "; ".join(details)))
        if isinstance(sample, Sample) and sample.rebuilt_completion_ids is not None:
            self.oracle_checked += 1
            self.oracle_matches += oracle is None
            if oracle is not None and len(self.oracle_divergences) < keep_worst:
                self.oracle_divergences.append((sample.item_id, oracle))
        self.failed += bool(failing)
        self.problems.update(problems)
        if reparse is not None and len(self.reparse) < keep_worst:
            if isinstance(sample, Sample):
                self.reparse.append((sample.item_id, reparse))
            else:  # the error names its item first
                item, _, why = reparse.partition(": ")
                self.reparse.append((item, why))
        if isinstance(sample, ReconstructError):
            return
        self.exact_ids += sample.source == "exact"
        self.completion.add(sample.completion_diff)
        self.prompt.add(sample.prompt_diff)
        # The worst are the furthest off on either side: a prompt rebuilt wrong is as wrong.
        diff = max(abs(sample.completion_diff), abs(sample.prompt_diff))
        if diff and (len(self.worst) < keep_worst or diff > self.worst[-1][0]):
            billed = len(sample.completion_ids) - sample.completion_diff
            entry = (diff, sample.item_id, len(sample.completion_ids), billed, sample.prompt_diff)
            self.worst = sorted([*self.worst, entry], reverse=True)[:keep_worst]

    def merge(self, other: DatasetAudit) -> None:
        self.samples += other.samples
        self.truncated += other.truncated
        self.exact_ids += other.exact_ids
        self.failed += other.failed
        self.completion.merge(other.completion)
        self.prompt.merge(other.prompt)
        self.problems.update(other.problems)
        self.finish_reasons.update(other.finish_reasons)
        self.failing = [*self.failing, *other.failing]
        self.notes = [*self.notes, *other.notes][:5]
        self.worst = sorted([*self.worst, *other.worst], reverse=True)[:5]
        self.reparse = [*self.reparse, *other.reparse][:5]
        self.oracle_checked += other.oracle_checked
        self.oracle_matches += other.oracle_matches
        self.oracle_divergences = [*self.oracle_divergences, *other.oracle_divergences][:5]


@lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Any:
    """A JSON-schema validator for a tool's parameters, or None when the schema is itself
    invalid (datasets ship loose schemas; that is not the answer's fault)."""
    import jsonschema

    try:
        schema = json.loads(schema_json)
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except (jsonschema.SchemaError, ValueError, TypeError):
        return None


def off_schema(tool: Any, validator: Any, args: Any) -> str:
    """Which argument of a call breaks its tool's schema, and the schema's rule it breaks."""
    import jsonschema

    err = jsonschema.exceptions.best_match(validator.iter_errors(args))
    where = err.json_path if err.path else "(the arguments object)"
    return f"tool {tool}: argument {where}: {err.message} (schema rule {err.validator})"


def structure(
    row: ExportRow, markers: tuple[str, ...], checks: Checks, details: list[str] | None = None
) -> list[str]:
    """The answer's structural problems, by name; `details` gets what a problem says of
    itself (the argument and the schema rule of `arguments_off_schema`)."""
    problems = []
    finish = row.finish_reason
    if checks.expect_reasoning and not row.reasoning and finish != "length":
        problems.append("no_reasoning")
    if any(m in row.content for m in markers):
        problems.append("marker_in_content")
    if row.reasoning and any(m in row.reasoning for m in markers):
        problems.append("marker_in_reasoning")
    tools = row.conversation.get("tools") or []
    declared = {
        (t.get("function") or {}).get("name"): (t.get("function") or {}).get("parameters")
        for t in tools
        if isinstance(t, dict)
    }
    for c in row.tool_calls:
        fn = c.get("function") or {}
        name = fn.get("name")
        if tools and name not in declared:
            problems.append("undeclared_tool")
            continue
        try:
            args = json.loads(fn.get("arguments") or "")
        except (json.JSONDecodeError, TypeError):
            problems.append("arguments_not_json")
            continue
        schema = declared.get(name)
        if isinstance(schema, dict) and schema:
            validator = _validator(json.dumps(schema, sort_keys=True))
            if validator is not None and not validator.is_valid(args):
                problems.append("arguments_off_schema")
                if details is not None:
                    details.append(off_schema(name, validator, args))
    if finish not in ("stop", "length", "tool_calls"):
        problems.append(f"finish_{finish or 'none'}")
    elif finish == "tool_calls" and not row.tool_calls:
        problems.append("tool_calls_finish_without_calls")
    if row.provider is not None and row.provider in checks.excluded_providers:
        problems.append("excluded_provider")
    return problems


def text_problems(row: ExportRow) -> list[str]:
    """What is wrong with the answer's text, without a rebuild: far longer than its bill
    (TEXT_BYTES_PER_BILLED_TOKEN; not for counts that were themselves estimated from the
    text), or holding U+FFFD."""
    texts = [row.content, row.reasoning or ""]
    for c in row.tool_calls:
        fn = c.get("function") or {}
        texts += [str(fn.get("name") or ""), str(fn.get("arguments") or "")]
    problems = []
    if row.usage_source not in ("estimate", "worst"):
        size = sum(len(t.encode("utf-8", "replace")) for t in texts)
        if size > TEXT_BYTES_PER_BILLED_TOKEN * max(1, row.completion_tokens):
            problems.append("text_long_for_bill")
    if any(REPLACEMENT in t for t in texts):
        problems.append("replacement_character")
    return problems


def reparse(row: ExportRow, sample: Sample, target: Target) -> str | None:
    """Decode the rebuilt completion, parse it as the servers' parsers would, and say where
    it first differs from the stored answer (None when it gives the answer back). Answers cut
    at max_tokens are not checked: a cut can fall inside a call, which the parser drops."""
    if row.finish_reason == "length":
        return None
    name = target.family.name
    answer = target.answer(row, sample.prefill)
    try:
        got = parse(name, target.decode(sample.completion_ids), answer, target.stops)
    except ValueError:
        return None  # a family without a parser
    return first_difference(got, server_form(name, answer), strip=target.family.name not in LEGACY)


def server_insertions(
    row: ExportRow, completion_ids: list[int], prefill: str, target: Target
) -> dict[str, tuple[str, str]] | None:
    """Whether the stored answer differs from what its ids parse to only by whitespace the
    server put before or after a field (text its ids do not hold: a server that answers `\n\n`
    before the content with thinking off): per field, where (`before`, `after`) and what;
    None otherwise, or when they agree."""
    name = target.family.name
    answer = target.answer(row, prefill)
    try:
        got = parse(name, target.decode(completion_ids), answer, target.stops)
    except ValueError:
        return None
    want = server_form(name, answer)
    if got.calls != want.calls:
        return None
    found = {}
    for field_name in ("reasoning", "content"):
        g, w = getattr(got, field_name), getattr(want, field_name)
        if g == w:
            continue
        if g and w.endswith(g) and not w[: len(w) - len(g)].strip():
            found[field_name] = ("before", w[: len(w) - len(g)])
        elif w.startswith(g) and not w[len(g) :].strip():
            found[field_name] = ("after", w[len(g) :])
        else:
            return None
    return found or None


def inserted_by_server(row: ExportRow, sample: Sample, target: Target) -> str | None:
    """server_insertions for a sample, said as which text and where; None when there are
    none."""
    found = server_insertions(row, sample.completion_ids, sample.prefill, target)
    if found is None:
        return None
    said = [f"{text!r} {where} the {name}" for name, (where, text) in found.items()]
    return (
        f"the server inserted {' and '.join(said)} it returned, which its token ids do not "
        "hold: the ids (which the rebuild equals) are kept as the answer"
    )


def as_ids_hold(row: ExportRow, target: Target, sample: Sample | None = None) -> ExportRow:
    """The row with the answer's text as its exact token ids hold it: the text the server
    inserted around a field (server_insertions) taken out, so that a record's text and its
    ids agree (the ids are what the model wrote). The row as it is when it has no exact ids,
    they hold its text, or it differs from them in another way (the audit's to name)."""
    if all(f == f.strip() for f in (row.content, row.reasoning or "")):
        return row  # nothing around a field to take out: spare the parse
    if sample is not None and sample.source == "exact":
        completion, prefill = sample.completion_ids, sample.prefill
    elif row.completion_token_ids is not None and row.prompt_token_ids is not None:
        completion = unpack_ids(row.completion_token_ids) or []
        prefill = target.prefill(target.decode(unpack_ids(row.prompt_token_ids) or []))
    else:
        return row
    found = server_insertions(row, completion, prefill, target)
    if found is None:
        return row
    fields = {"reasoning": row.reasoning or "", "content": row.content}
    for name, (where, text) in found.items():
        stored = fields[name]
        fields[name] = stored.removeprefix(text) if where == "before" else stored.removesuffix(text)
        if fields[name] == stored:  # the inserted text is not at that end of the field
            return row
    reasoning = fields["reasoning"] if row.reasoning is not None else None
    return replace(row, reasoning=reasoning, content=fields["content"])


def divergence(server: list[int], rebuilt: list[int], decode: Callable[[list[int]], str]) -> str:
    """Where two id sequences first differ, with the tokens' text on each side."""
    i = next((k for k, (a, b) in enumerate(zip(server, rebuilt, strict=False)) if a != b), None)
    if i is None:
        i = min(len(server), len(rebuilt))
    before = decode(server[max(0, i - 6) : i])

    def tok(ids: list[int]) -> str:
        return f"{ids[i]} {decode([ids[i]])!r}" if i < len(ids) else "(end)"

    return (
        f"token {i} of {len(server)} (rebuilt: {len(rebuilt)}), after {before!r}: "
        f"server {tok(server)}, rebuilt {tok(rebuilt)}"
    )


def oracle_difference(sample: Sample, target: Target) -> str | None:
    """Where the rebuild of an answer first differs from the server's own ids (None when it
    equals them, or the server gave none)."""
    server_c, rebuilt_c = sample.completion_ids, sample.rebuilt_completion_ids
    if rebuilt_c is None or sample.source != "exact":
        return None
    rebuilt_p = sample.rebuilt_prompt_ids
    if rebuilt_p is not None and rebuilt_p != sample.prompt_ids:
        return "prompt " + divergence(sample.prompt_ids, rebuilt_p, target.decode)
    if rebuilt_c != server_c:
        return "completion " + divergence(server_c, rebuilt_c, target.decode)
    return None


@dataclass(frozen=True)
class Verdict:
    """What is wrong with one answer, with the first difference of each check that says
    where."""

    problems: list[str]
    reparse: str | None = None
    oracle: str | None = None
    exact: bool = False
    """The sample's ids are the server's (a wrong rebuild does not make them wrong)."""
    details: list[str] = field(default_factory=list)
    """What the problems say of themselves: counts off their bills, the argument off its
    schema."""

    @property
    def problems_of_the_answer(self) -> list[str]:
        """The problems that make the sample unfit for training. Where its ids are the
        server's, a rebuild that differs from them or loses text says the grammar is wrong,
        not the answer."""
        of_the_rebuild = {"rebuild_differs_from_server", "server_inserted_text"}
        if self.exact:
            of_the_rebuild |= {"rebuild_loses_text", "reparse_mismatch"}
        return [p for p in self.problems if p not in of_the_rebuild]


def sample_problems(
    row: ExportRow, sample: Sample | ReconstructError, target: Target, checks: Checks
) -> Verdict:
    """Everything wrong with one answer: its structure, its rebuilt length (completion and
    prompt, each on its own), whether the rebuild holds every part of the answer and parses
    back, and whether it equals the server's ids where it has them."""
    if isinstance(sample, ReconstructError):
        return Verdict(["reconstruct_error", *text_problems(row)], str(sample))
    details: list[str] = []
    problems = structure(row, target.family.markers, checks, details) + text_problems(row)
    # Usage the gate did not believe holds worst cases, not counts: no bill to compare with.
    billed = row.usage_source != "worst"
    if billed and abs(sample.completion_diff) > checks.max_sample_diff:
        problems.append("length_off_billed")
        details.append(off_bill("completion", len(sample.completion_ids), sample.completion_diff))
    if billed and row.prompt_tokens and abs(sample.prompt_diff) > checks.max_sample_diff:
        problems.append("prompt_off_billed")
        details.append(off_bill("prompt", len(sample.prompt_ids), sample.prompt_diff))
    if sample.lost is not None:
        problems.append("rebuild_loses_text")
    diff = reparse(row, sample, target)
    oracle = oracle_difference(sample, target) if row.finish_reason != "length" else None
    inserted = None
    if diff is not None and sample.source == "exact" and oracle is None:
        inserted = inserted_by_server(row, sample, target)
    if inserted is not None:  # the server's ids, which the rebuild equals, win: said
        problems.append("server_inserted_text")
        details.append(inserted)
        diff = None
    elif diff is not None:
        problems.append("reparse_mismatch")
    if oracle is not None:
        problems.append("rebuild_differs_from_server")
    return Verdict(problems, diff or sample.lost, oracle, sample.source == "exact", details)


def off_bill(side: str, rebuilt: int, diff: int) -> str:
    """A count off its bill, in words."""
    return f"{side} rebuilt {rebuilt} tokens, billed {rebuilt - diff}"


def rebuilt(
    store: Store,
    dataset: str,
    target: Target,
    since: float | None = None,
    wanted: Callable[[ExportRow], bool] = lambda row: True,
) -> Iterator[tuple[ExportRow, Sample | ReconstructError | None]]:
    """Each answer of a dataset with its rebuilt sample, in source order, rebuilt in batches;
    an answer `wanted` turns down comes with None, unbuilt."""
    rows: list[ExportRow] = []
    batch: list[ExportRow] = []

    def flush() -> Iterator[tuple[ExportRow, Sample | ReconstructError | None]]:
        samples = iter(target.samples(batch))
        for row in rows:
            yield row, (next(samples) if wanted(row) else None)
        rows.clear()
        batch.clear()

    for row in store.answers.export_rows(dataset, since):
        rows.append(row)
        if wanted(row):
            batch.append(row)
            if len(batch) == BATCH:
                yield from flush()
    yield from flush()


def target_for(store: Store, **overrides: Any) -> Target:
    """The job's recorded `[reconstruct]` settings with command-line overrides."""
    meta = store.get_meta("reconstruct")
    fields = json.loads(store.get_meta("fingerprint_fields") or "{}")
    spec: TargetSpec = spec_from_store(
        json.loads(meta) if meta else None,
        fields.get("generation"),
        server_kwargs(e.get("extra") for e in fields.get("endpoints") or []),
        **overrides,
    )
    return Target(spec)


def server_kwargs(extra_bodies: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """The `chat_template_kwargs` the job's endpoints send in `extra_body` (vLLM, SGLang)."""
    out: dict[str, Any] = {}
    for extra in extra_bodies:
        kwargs = (extra or {}).get("chat_template_kwargs")
        if isinstance(kwargs, dict):
            out.update(kwargs)
    return out


def checks_for(store: Store, **kwargs: Any) -> Checks:
    excluded = json.loads(store.get_meta("excluded_providers") or "[]")
    extra = kwargs.pop("excluded_providers", ())
    return Checks(excluded_providers=frozenset([*excluded, *extra]), **kwargs)


def audit(
    out: Path,
    *,
    include_truncated: bool = False,
    worst: int = 5,
    checks: dict[str, Any] | None = None,
    **target: Any,
) -> tuple[list[DatasetAudit], Target]:
    store = Store.open_readonly(out)
    try:
        tgt = target_for(store, **target)
        chk = checks_for(store, **(checks or {}))

        def counted(row: ExportRow) -> bool:
            return include_truncated or row.finish_reason != "length"

        audits = []
        for p in store.work.dataset_progress():
            a = DatasetAudit(p.name)
            audits.append(a)
            for row, sample in rebuilt(store, p.name, tgt, wanted=counted):
                a.finish_reasons[row.finish_reason or "none"] += 1
                if sample is None:
                    a.truncated += 1
                else:
                    v = sample_problems(row, sample, tgt, chk)
                    # A sample fails what would drop it from an export (--drop-failed-audit):
                    # the server's own ids are not failed by a rebuild that disagrees.
                    a.add(
                        sample,
                        v.problems,
                        worst,
                        v.reparse,
                        v.oracle,
                        v.problems_of_the_answer,
                        v.details,
                    )
    finally:
        store.close()
    return audits, tgt


def broken_limits(
    overall: dict[str, Any], max_mean_diff: float, max_prompt_mean_diff: float, max_share: float
) -> list[str]:
    """The job-wide limits (`regen audit --max-mean-diff` and friends) the audit's totals
    (`audit_json`'s overall) break, one line each."""
    broken = []
    if overall["mean_abs_diff"] > max_mean_diff:
        broken.append(f"mean abs diff {overall['mean_abs_diff']} > {max_mean_diff}")
    if overall["prompt_mean_abs_diff"] > max_prompt_mean_diff:
        broken.append(
            f"prompt mean abs diff {overall['prompt_mean_abs_diff']} > {max_prompt_mean_diff}"
        )
    if overall["samples"] and overall["failed"] / overall["samples"] > max_share:
        broken.append(f"{overall['failed']} of {overall['samples']} samples fail a check")
    return broken


def audit_json(audits: list[DatasetAudit]) -> dict[str, Any]:
    total = DatasetAudit("all")
    for a in audits:
        total.merge(a)
    return {"datasets": [_one(a) for a in audits], "overall": _one(total)}


def _one(a: DatasetAudit) -> dict[str, Any]:
    return {
        "name": a.name,
        "samples": a.samples,
        "truncated_left_out": a.truncated,
        "exact_ids": a.exact_ids,
        "mean_abs_diff": round(a.per_sample(a.completion.abs_sum), 4),
        "max_abs_diff": a.completion.max_abs,
        "match_share": round(a.per_sample(a.completion.matches), 4),
        "prompt_mean_abs_diff": round(a.per_sample(a.prompt.abs_sum), 4),
        "prompt_max_abs_diff": a.prompt.max_abs,
        "prompt_match_share": round(a.per_sample(a.prompt.matches), 4),
        "failed": a.failed,
        "worst": [
            {"abs_diff": d, "item_id": i, "rebuilt": r, "billed": b, "prompt_diff": p}
            for d, i, r, b, p in a.worst
        ],
        "problems": dict(sorted(a.problems.items())),
        "finish_reasons": dict(sorted(a.finish_reasons.items())),
        "reparse": [{"item_id": i, "first_difference": d} for i, d in a.reparse],
        "failing": [{"item_id": i, "problems": p, "details": d} for i, p, d in a.failing],
        "notes": [{"item_id": i, "note": n} for i, n in a.notes],
        "server_ids_checked": a.oracle_checked,
        "server_ids_match_share": round(a.oracle_matches / a.oracle_checked, 4)
        if a.oracle_checked
        else None,
        "server_ids_divergences": [
            {"item_id": i, "first_divergence": d} for i, d in a.oracle_divergences
        ],
    }


@dataclass
class Drift:
    """A sample the live audit flagged."""

    dataset: str
    item_id: str
    rebuilt: int
    billed: int
    problems: list[str]

    def line(self) -> str:
        return (
            f"audit: {self.dataset} item {self.item_id}: rebuilt {self.rebuilt} completion "
            f"tokens, billed {self.billed} ({', '.join(self.problems)})"
        )


class LiveAudit:
    """The audit as a run goes: every step rebuilds up to `sample` of the answers committed
    since the previous step (the first ones; the rest are skipped) and keeps the tally. Runs
    in a worker thread with its own read-only connection; costs a few milliseconds a step."""

    def __init__(self, out: Path, target: Target, checks: Checks, sample: int = 32) -> None:
        self.out, self.target, self.checks, self.sample = out, target, checks, sample
        self.tally = DatasetAudit("live")
        self.drifts: list[Drift] = []
        self._cursor = 0

    def step(self) -> list[Drift]:
        """Audit the next sample; return the samples that failed."""
        store = Store.open_readonly(self.out)
        try:
            found = store.answers.results_after(self._cursor, self.sample)
            self._cursor = max(store.answers.last_result_rowid(), self._cursor)
        finally:
            store.close()
        rows = [row for _, _, row in found if row.finish_reason != "length"]
        names = {row.item_id: name for _, name, row in found}
        new: list[Drift] = []
        for row, sample in zip(rows, self.target.samples(rows), strict=True):
            v = sample_problems(row, sample, self.target, self.checks)
            problems = v.problems
            self.tally.add(sample, problems, 5, v.reparse, v.oracle)
            if problems:
                n = 0 if isinstance(sample, ReconstructError) else len(sample.completion_ids)
                new.append(
                    Drift(names[row.item_id], row.item_id, n, row.completion_tokens, problems)
                )
        self.drifts = (self.drifts + new)[-20:]
        return new

    def summary(self) -> dict[str, Any]:
        tally = _one(self.tally)
        return {
            "family": self.target.spec.family,
            "checked": tally["samples"],
            **{
                k: tally[k]
                for k in ("failed", "mean_abs_diff", "max_abs_diff", "prompt_mean_abs_diff")
            },
            "problems": tally["problems"],
            "recent_drifts": [d.__dict__ for d in self.drifts[-5:]],
        }
