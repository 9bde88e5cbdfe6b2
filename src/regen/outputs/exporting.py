"""`regen export`'s flow: the output directory's state opened read-only, the datasets the
options name checked, the target (and the audit's checks) when the format needs or can use
one, and the export written (outputs/export.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.errors import ConfigError, UsageError
from regen.outputs.audit import Checks, checks_for, target_for
from regen.outputs.export import ExportOptions, export_job
from regen.reconstruct import Target
from regen.state.db import Store


@dataclass
class Exported:
    """What an export wrote (its manifest), and what its target said on the way."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def export_out_dir(
    out: Path,
    to: Path,
    opts: ExportOptions,
    overrides: dict[str, Any],
    *,
    expect_reasoning: bool = False,
) -> Exported:
    """Export the job in `out` into `to` with `opts`; `overrides` rebuild ids as `regen
    audit`'s target flags say (each None: the job's [reconstruct])."""
    store = Store.open_readonly(out)
    try:
        names = [p.name for p in store.work.dataset_progress()]
        unknown = sorted((set(opts.weights) | set(opts.caps)) - set(names))
        if unknown:
            raise UsageError(f"no dataset {', '.join(unknown)} in {out} (have: {', '.join(names)})")
        done = Exported({})
        target, checks = export_checks(store, opts, overrides, expect_reasoning, done)
        done.manifest = export_job(store, names, to, opts, target, checks)
        return done
    finally:
        store.close()


def export_checks(
    store: Store,
    opts: ExportOptions,
    overrides: dict[str, Any],
    expect_reasoning: bool,
    said: Exported,
) -> tuple[Target | None, Checks | None]:
    """The target the export rebuilds ids and text with, when it needs or can use one, and
    the audit's checks with it; its notes and warnings kept in `said`."""
    recorded = store.get_meta("reconstruct") is not None
    ids = opts.format in ("tokenized", "specforge") and not opts.train_source_turns
    # Formats with text: the model's template decides which reasoning of the history is
    # kept, and an answer's text is what its exact ids hold (outputs.audit.as_ids_hold).
    text = opts.format != "tokenized"
    target = None
    if opts.drop_failed_audit or ((ids or text) and (recorded or overrides.get("family"))):
        optional = not ids and not opts.drop_failed_audit
        target = export_target(store, overrides, said, optional=optional)
    if target is None:
        return None, None
    said.notes += target.notes
    said.warnings += target.warnings
    checks = checks_for(
        store,
        expect_reasoning=expect_reasoning,
        max_sample_diff=opts.max_sample_diff,
        excluded_providers=opts.exclude_providers,
    )
    return target, checks


def export_target(
    store: Store, overrides: dict[str, Any], said: Exported, *, optional: bool
) -> Target | None:
    """The target that rebuilds ids; for sharegpt, where it only decides which history
    reasoning the template shows, one that cannot be loaded is said and gone without."""
    try:
        return target_for(store, **overrides)
    except ConfigError as exc:
        if not optional:
            raise
        said.warnings.append(f"{exc}; the history's reasoning is written as it was stored")
        return None
