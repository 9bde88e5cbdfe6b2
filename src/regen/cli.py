"""The command line: parse arguments, call the modules, map errors to one line and an exit code.

Exit codes: 0 done, 1 user or config error, 2 usage error, 3 finished with failed items,
4 a cap or the credit floor stopped it, 5 items left unsent, 130 aborted by a second signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sqlite3
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from regen import __version__
from regen.completion import SHELLS
from regen.completion import script as completion_script
from regen.errors import ConfigError, Interrupted, RegenError
from regen.safe import printable, redacted
from regen.view.console import KeyFreeConsole, command_console

if TYPE_CHECKING:
    from regen.config import EndpointConfig
    from regen.engine.providers import EndpointInfo
    from regen.outputs.export import ExportOptions
    from regen.view.progress import Watch

EXIT_OK, EXIT_USER, EXIT_USAGE, EXIT_FAILED_ITEMS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CAP, EXIT_ITEMS_LEFT = 4, 5
"""A run that ends with items left says so in its exit code: 4 when the job's dollar cap or
the credit floor stopped it (a planned end), 5 for any other reason (the next run sends
them). A dataset whose own budget is met is done: that is 0."""


HELP = """\
Regenerate the answers of prompt datasets with a target model through OpenAI-compatible
APIs (OpenRouter, vLLM, SGLang), within token and dollar budgets, resuming where a run
stopped, and export them as training data with the model's exact token ids."""
HELP_END = """\
Start with `regen demo` (no key needed), then `regen plan JOB.toml` before `regen run JOB.toml`.
exit codes: 0 done, 1 an error in the job, its data or its state (one line says which),
2 wrong usage, 3 finished with failed items, 4 a dollar cap or the credit floor stopped it,
5 items left unsent (run again to send them), 130 aborted by a second signal (resumable)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="regen",
        description=HELP,
        epilog=HELP_END,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"regen {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _run_parser,
        _plan_parser,
        _status_parser,
        _audit_parser,
        _export_parser,
        _providers_parser,
        _families_parser,
        _schema_parser,
        _report_parser,
        _inspect_parser,
        _sim_parser,
        _demo_parser,
        _completion_parser,
    ):
        add(sub)
    return p


def _run_parser(sub: Any) -> None:
    """`regen run` and its options."""
    run = sub.add_parser("run", help="regenerate a job's datasets (resumes where it stopped)")
    run.add_argument("job", type=Path, help="job file (TOML)")
    run.add_argument("--out", type=Path, help="output directory (overrides [job].output_dir)")
    run.add_argument(
        "--force",
        action="store_true",
        help="resume even though the job's data-affecting settings changed",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics while the job runs",
    )


def _plan_parser(sub: Any) -> None:
    """`regen plan` and its options."""
    plan = sub.add_parser(
        "plan", help="estimate items, tokens, cost and time per dataset before spending"
    )
    plan.add_argument("job", type=Path, help="job file (TOML)")
    plan.add_argument("--out", type=Path, help="output directory (overrides [job].output_dir)")
    plan.add_argument(
        "--pilot",
        type=int,
        default=0,
        metavar="N",
        help="first send up to N items per dataset (a seeded sample, kept for the run) and "
        "estimate from their answers; spends what those N answers cost",
    )
    plan.add_argument(
        "--precision",
        type=float,
        metavar="P",
        help="with --pilot N: send the pilot in rounds (30 items per dataset first) until each "
        "lane's time and the job's cost over the items to come are known within +/-P at "
        "p10-p90 (0.1: 10%%), N items per dataset at most",
    )
    plan.add_argument(
        "--pilot-time",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="the pilot ends within this many seconds: sending stops a tenth before, requests "
        "in flight get that tenth (default 600)",
    )
    plan.add_argument(
        "--pilot-usd",
        type=float,
        metavar="USD",
        help="the pilot spends at most this (default: --pilot-share of the job's dollar cap, or "
        "without one of its expected cost once the first round has measured it)",
    )
    plan.add_argument(
        "--pilot-share",
        type=float,
        default=0.05,
        metavar="S",
        help="the share of the job's dollar cap (or expected cost) and of each dataset's token "
        "budget a pilot may use (default 0.05); a dataset stops at its share and the plan says so",
    )
    plan.add_argument("--json", action="store_true", help="print the estimates as JSON")


def _status_parser(sub: Any) -> None:
    """`regen status` and its options."""
    status = sub.add_parser("status", help="where a job stands (read-only: safe while it runs)")
    status.add_argument("out", type=Path, help="the job's output directory")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="show it again every SECONDS (5 by default) until Ctrl-C",
    )


def _audit_parser(sub: Any) -> None:
    """`regen audit` and its options."""
    aud = sub.add_parser(
        "audit",
        help="check reconstructed completions against billed tokens, and answers' structure",
    )
    aud.add_argument("out", type=Path, help="the job's output directory")
    _target_flags(aud)
    aud.add_argument("--expect-reasoning", action="store_true", help="every answer reasons")
    aud.add_argument(
        "--include-truncated",
        action="store_true",
        help="count answers cut at max_tokens too (left out by default, as exports drop them)",
    )
    aud.add_argument(
        "--max-mean-diff",
        type=float,
        default=2.0,
        metavar="TOKENS",
        help="fail above this mean absolute difference (2)",
    )
    aud.add_argument(
        "--max-prompt-mean-diff",
        type=float,
        default=2.0,
        metavar="TOKENS",
        help="fail above this mean absolute difference in prompt tokens (2)",
    )
    aud.add_argument(
        "--max-sample-diff",
        type=int,
        default=3,
        metavar="TOKENS",
        help="a sample whose completion differs from the bill by more than this fails (3)",
    )
    aud.add_argument(
        "--exclude-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="flag answers from this provider (as well as those the run excluded)",
    )
    aud.add_argument(
        "--max-problem-share",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="fail when more samples than this share fail a check (0)",
    )
    aud.add_argument("--json", action="store_true", help="print the audit as JSON")


def _export_parser(sub: Any) -> None:
    """`regen export` and its options."""
    exp = sub.add_parser(
        "export", help="write a job's answers in a trainer's format, filtered, mixed and split"
    )
    exp.add_argument("out", type=Path, help="the job's output directory")
    exp.add_argument(
        "--format", default="specforge", choices=("specforge", "openai", "sharegpt", "tokenized")
    )
    exp.add_argument("--to", type=Path, help="folder to write (default OUT/export/FORMAT)")
    _export_filter_flags(exp)
    _export_mix_flags(exp)
    _export_hub_flags(exp)
    _export_loss_flags(exp)
    _target_flags(exp)


def _export_filter_flags(exp: argparse.ArgumentParser) -> None:
    """`regen export`: which answers are left out (all counted as dropped in the manifest)."""
    exp.add_argument("--keep-truncated", action="store_true", help="keep answers cut at max_tokens")
    exp.add_argument("--keep-empty", action="store_true", help="keep empty answers")
    exp.add_argument(
        "--keep-orphans",
        action="store_true",
        help="keep answers to rows no longer in their dataset's source (as last read)",
    )
    exp.add_argument("--min-tokens", type=int, metavar="N", help="drop answers shorter than this")
    exp.add_argument("--max-tokens", type=int, metavar="N", help="drop answers longer than this")
    exp.add_argument(
        "--exclude-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="drop answers this provider (display name) served; repeatable",
    )


def _export_mix_flags(exp: argparse.ArgumentParser) -> None:
    """`regen export`: how datasets are mixed, split, deduplicated, sampled and sharded, and
    --since-last."""
    exp.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="DATASET=W",
        help="write each sample of DATASET W times on average (0.5 halves, 2 doubles)",
    )
    exp.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="DATASET=N",
        help="at most N samples of DATASET",
    )
    exp.add_argument(
        "--validation",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="share of conversations in a validation split (seeded)",
    )
    exp.add_argument("--seed", type=int, default=0, help="seed of the split and the weights")
    exp.add_argument("--dedup", action="store_true", help="drop repeated samples")
    exp.add_argument(
        "--since-last",
        action="store_true",
        help="only answers stored since the previous export to the same folder, as a new part",
    )
    exp.add_argument("--shard-rows", type=int, default=100_000, help="tokenized: rows per file")
    exp.add_argument(
        "--samples",
        choices=("all", "first"),
        default="all",
        help="all the samples of each prompt, or the first that passes the filters",
    )


def _export_hub_flags(exp: argparse.ArgumentParser) -> None:
    """`regen export`: the upload to the Hugging Face Hub and the card's licence."""
    exp.add_argument(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="upload the export folder as a Hugging Face dataset repository (created if "
        "missing; token from HF_TOKEN or huggingface-cli login)",
    )
    exp.add_argument(
        "--private", action="store_true", help="with --push-to-hub: create the repository private"
    )
    exp.add_argument(
        "--license",
        default="unknown",
        metavar="ID",
        help="the dataset card's licence, a Hub licence id (default unknown: the sources' "
        "licences and the target's terms decide it)",
    )


def _export_loss_flags(exp: argparse.ArgumentParser) -> None:
    """`regen export`: which turns carry loss, and dropping samples that fail the audit."""
    exp.add_argument(
        "--train-source-turns",
        action="store_true",
        help="write the dataset's own assistant turns of an answer's history as plain turns, "
        "which trainers train on unless their last-turn switch is on (SpecForge "
        "data.train_only_last_turn, LLaMA-Factory mask_history); by default they carry no loss",
    )
    exp.add_argument(
        "--drop-failed-audit",
        action="store_true",
        help="drop samples that fail regen audit's checks (needs a template family)",
    )
    exp.add_argument(
        "--max-sample-diff",
        type=int,
        default=3,
        metavar="TOKENS",
        help="with --drop-failed-audit: drop samples further than this from the bill (3)",
    )
    exp.add_argument(
        "--expect-reasoning",
        action="store_true",
        help="with --drop-failed-audit: drop answers without reasoning",
    )


def _providers_parser(sub: Any) -> None:
    """`regen providers` and its options."""
    prov = sub.add_parser(
        "providers",
        help="list a model's OpenRouter endpoints and which of them a job's filters exclude",
    )
    prov.add_argument("model", help="model id, e.g. moonshotai/kimi-k2.5")
    prov.add_argument("--job", type=Path, help="mark what this job's [endpoint] provider excludes")
    prov.add_argument("--endpoint", help="which of the job's endpoints (the first by default)")
    prov.add_argument(
        "--base-url", help="API base URL (default: the job's endpoint, else OpenRouter's)"
    )
    prov.add_argument("--json", action="store_true", help="print endpoints and verdicts as JSON")


def _families_parser(sub: Any) -> None:
    """`regen families`."""
    fam = sub.add_parser(
        "families",
        help="the model families regen rebuilds ids for: how, checked against what, assumed",
    )
    fam.add_argument("--json", action="store_true", help="print the families as JSON")


def _schema_parser(sub: Any) -> None:
    """`regen schema`."""
    sub.add_parser(
        "schema",
        help="print the job file's JSON Schema, for an editor to check a job file as it is typed",
    )


def _report_parser(sub: Any) -> None:
    """`regen report` and its options."""
    rep = sub.add_parser(
        "report", help="write <out>/report.html: throughput, lengths, latency, cost, errors"
    )
    rep.add_argument("out", type=Path, help="the job's output directory")
    rep.add_argument("--to", type=Path, help="write the page here instead")


def _inspect_parser(sub: Any) -> None:
    """`regen inspect` and its options."""
    insp = sub.add_parser(
        "inspect", help="show how a dataset's rows become requests (reads the source only)"
    )
    insp.add_argument("job", type=Path, help="job file (TOML)")
    insp.add_argument("--dataset", required=True, help="the dataset's name in the job")
    insp.add_argument("--rows", type=int, default=3, metavar="N", help="how many rows (3)")
    insp.add_argument(
        "--from", dest="start", type=int, default=0, metavar="ROW", help="first row number (0)"
    )
    insp.add_argument("--json", action="store_true", help="print rows and request bodies as JSON")


def _sim_parser(sub: Any) -> None:
    """`regen sim` and its options."""
    sim = sub.add_parser(
        "sim", help="serve a simulated OpenRouter, vLLM or SGLang server on 127.0.0.1"
    )
    sim.add_argument("--port", type=int, default=8787)
    sim.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sim.add_argument("--config", type=Path, help="sim config (TOML)")
    sim.add_argument(
        "--credits",
        type=float,
        metavar="USD",
        help="the key's credit limit, shown by /key (default: the config's, else none)",
    )
    sim.add_argument(
        "--dialect",
        choices=("openrouter", "vllm", "sglang"),
        help="which server to be (default: the config's, else openrouter)",
    )
    sim.add_argument(
        "--served-model-name",
        metavar="MODEL",
        help="vllm/sglang: the model served (default: the config's first model)",
    )


def _demo_parser(sub: Any) -> None:
    """`regen demo` and its options."""
    demo = sub.add_parser("demo", help="run the bundled demo job against an in-process simulator")
    demo.add_argument("--out", type=Path, default=Path("demo-out"))


def _completion_parser(sub: Any) -> None:
    """`regen completion`."""
    comp = sub.add_parser("completion", help="print a shell completion script for regen")
    comp.add_argument("shell", choices=SHELLS, help="the shell it is for")


def _completion(args: argparse.Namespace, console: Console) -> int:
    """The script goes to stdout as it is (rich would read its brackets as markup)."""
    sys.stdout.write(completion_script(_parser(), args.shell))
    return EXIT_OK


@contextlib.contextmanager
def key_free_output() -> Iterator[None]:
    """stdout and stderr for the length of a command: streams that take every registered key
    out of what is written (prints, rich, warnings and tracebacks alike)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = redacted(sys.stdout), redacted(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code."""
    try:
        with key_free_output():
            try:
                return _main(argv)
            except BrokenPipeError:
                raise
            except Exception:
                # A bug (or --debug): the traceback goes through the redacting stderr, not
                # Python's own hook after this function has put the plain streams back.
                traceback.print_exc()
                return EXIT_USER
    except BrokenPipeError:
        # The reader went away (`regen families --json | head`): what it read is all it
        # wanted. Output goes nowhere from here, so the interpreter's last flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    console = command_console()
    handlers = {
        "run": _run,
        "plan": _plan,
        "status": _status,
        "audit": _audit,
        "export": _export,
        "providers": _providers,
        "families": _families,
        "schema": _schema,
        "report": _report,
        "inspect": _inspect,
        "sim": _sim,
        "demo": _demo,
        "completion": _completion,
    }
    try:
        return handlers[args.command](args, console)
    except RegenError as exc:
        if args.debug:
            raise
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except sqlite3.DatabaseError as exc:
        # Damage inside state.db shows on the first read of the damaged page, wherever that is.
        if args.debug:
            raise
        from regen.state.db import storage_hint

        where = getattr(args, "out", None) or getattr(args, "job", None) or "the job"
        print(
            f"error: {where}: state.db cannot be read: {printable(str(exc))}{storage_hint(exc)}",
            file=sys.stderr,
        )
        return EXIT_USER
    except Interrupted as exc:
        console.print(
            f"stopped: {exc.signal_name} before the first request: nothing was sent, what was "
            "read is kept; run the same command again to resume",
            markup=False,
            highlight=False,
        )
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _schema(args: argparse.Namespace, console: Console) -> int:
    import json

    from regen.config import job_schema

    print(json.dumps(job_schema(), indent=2))
    return EXIT_OK


def _families(args: argparse.Namespace, console: Console) -> int:
    import json

    from regen.view.families import family_rows, show_families

    rows = family_rows()
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return EXIT_OK
    show_families(console, rows)
    return EXIT_OK


def _report(args: argparse.Namespace, console: Console) -> int:
    from regen.outputs.report import write_report

    print(f"report: {write_report(args.out, args.to)}")
    return EXIT_OK


def _run(args: argparse.Namespace, console: Console) -> int:
    from regen.run.signals import stop_signals

    # Signals are the run's own from here to the summary's last line (run/signals.py).
    with stop_signals():
        from regen.config import load_job
        from regen.run.runner import run_job

        overrides: dict[str, object] = (
            {"job.output_dir": str(args.out.resolve())} if args.out else {}
        )
        if args.metrics_port is not None:
            overrides["run.metrics_port"] = args.metrics_port
        job = load_job(args.job, **overrides)
        with _watched(console) as watch:
            report = run_job(job, shown=watch, force=args.force)
        code = _finish(report, console)
        _record_exit(job.output_path, code)
        _write_report(job.output_path, console)
        return code


@contextlib.contextmanager
def _watched(console: Console) -> Iterator[Watch]:
    """The terminal as a listener of the pipeline's events, and a run's progress shown on
    `console`, for the length of the block."""
    from regen.events import listening
    from regen.view.events import TerminalListener
    from regen.view.progress import Watch

    with listening(TerminalListener(console)):
        yield Watch(console)


def _write_report(out_dir: Path, console: Console) -> None:
    """report.html, once the run's exit code is recorded (its table of runs shows it)."""
    from regen.errors import StateError
    from regen.outputs.report import write_report

    try:
        write_report(out_dir)
    except (StateError, sqlite3.Error) as exc:
        # The report is a view: failing to write it never fails the run.
        console.print(f"warning: report.html not written: {exc}", markup=False)


def _record_exit(out_dir: Path, code: int) -> None:
    """Keep the run's exit code in state.db for `regen status` and the report; a state.db
    that cannot take it (gone, read-only) loses only this."""
    from regen.errors import StateError
    from regen.state.db import Store

    try:
        store = Store.open(out_dir)
    except (StateError, OSError, sqlite3.Error):
        return
    try:
        store.runs.set_exit_code(code)
    except (StateError, OSError, sqlite3.Error):
        pass
    finally:
        store.close()


def _plan(args: argparse.Namespace, console: Console) -> int:
    import json

    from regen.config import load_job
    from regen.run.pilot import Bounds, pilot_lines
    from regen.run.planner import plan_job, plan_json, verdict_lines
    from regen.run.runner import run_log_kept
    from regen.view.plan import show_plan

    bad = _plan_args_error(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    overrides = {"job.output_dir": str(args.out.resolve())} if args.out else {}
    job = load_job(args.job, **overrides)
    quiet = KeyFreeConsole(file=sys.stderr, width=160) if args.json else console
    bounds = Bounds(args.pilot_time, args.pilot_usd, args.pilot_share)
    with _watched(quiet) as watch, run_log_kept(job):
        plan = plan_job(job, shown=watch, pilot=args.pilot, precision=args.precision, bounds=bounds)
    if args.json:
        print(json.dumps(plan_json(plan)))
        return EXIT_OK
    pilot = [*pilot_lines(plan.pilot, args.precision), *plan.pilot_notes]
    show_plan(console, plan_json(plan), verdict_lines(plan.job), pilot)
    return EXIT_OK


def _plan_args_error(args: argparse.Namespace) -> str | None:
    """What is wrong with `regen plan`'s pilot options as given (None: nothing)."""
    if args.pilot < 0:
        return "--pilot must be 0 or more"
    if args.precision is not None and not (0 < args.precision < 1 and args.pilot > 0):
        return (
            "--precision takes a share between 0 and 1 (0.1: +/-10%) and needs "
            "--pilot N (the most items per dataset)"
        )
    return _pilot_bounds_error(args)


def _pilot_bounds_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the pilot's bounds as given (None: nothing)."""
    import math

    if not (math.isfinite(args.pilot_time) and args.pilot_time > 0):
        return "--pilot-time takes a number of seconds above 0 (600: ten minutes)"
    if args.pilot_usd is not None and not (math.isfinite(args.pilot_usd) and args.pilot_usd > 0):
        return "--pilot-usd takes an amount of dollars above 0"
    if not 0 < args.pilot_share <= 1:
        return "--pilot-share takes a share above 0 and at most 1 (0.05: 5%)"
    return None


def _status(args: argparse.Namespace, console: Console) -> int:
    import json
    import time

    from regen.view.status import snapshot_json, snapshot_view, take_snapshot

    if args.watch is not None and args.watch <= 0:
        print("error: --watch takes a number of seconds above 0", file=sys.stderr)
        return EXIT_USAGE

    def show() -> None:
        snap = take_snapshot(args.out)
        if args.json:
            print(json.dumps(snapshot_json(snap)), flush=True)
        else:
            if args.watch is not None and console.is_terminal:
                console.clear()
            console.print(snapshot_view(snap))

    if args.watch is None:
        show()
        return EXIT_OK
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends, at any moment
        while True:
            show()
            time.sleep(args.watch)
    return EXIT_OK


def _target_flags(p: argparse.ArgumentParser) -> None:
    """How ids are rebuilt; each flag overrides the job's [reconstruct] section."""
    p.add_argument("--family", help="template family (kimi-k2.5, qwen3, gpt-oss, ...)")
    p.add_argument(
        "--tokenizer", help="a folder with tokenizer files, a tokenizer.json, a hub id, or sim"
    )
    p.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use instead")
    p.add_argument(
        "--template-kwargs", metavar="JSON", help="extra chat-template arguments, as JSON"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=None,
        help="let the tokenizer run its own code (Kimi's tokenizer needs it)",
    )


def _target_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "family": args.family,
        "tokenizer": args.tokenizer,
        "chat_template": args.chat_template,
        "template_kwargs": args.template_kwargs,
        "trust_remote_code": args.trust_remote_code,
    }


def _audit(args: argparse.Namespace, console: Console) -> int:
    import json

    from regen.outputs.audit import audit, audit_json, broken_limits
    from regen.view.audit import show_audit

    audits, target = audit(
        args.out,
        include_truncated=args.include_truncated,
        checks={
            "expect_reasoning": args.expect_reasoning,
            "max_sample_diff": args.max_sample_diff,
            "excluded_providers": tuple(args.exclude_provider),
        },
        **_target_overrides(args),
    )
    for note in target.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    for warning in target.warnings:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    data = audit_json(audits)
    broken = broken_limits(
        data["overall"], args.max_mean_diff, args.max_prompt_mean_diff, args.max_problem_share
    )
    if args.json:
        print(json.dumps({**data, "broken": broken}))
    else:
        show_audit(console, data, target.spec, broken)
    return EXIT_FAILED_ITEMS if broken else EXIT_OK


def _pairs(values: list[str], flag: str, kind: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for v in values:
        name, sep, num = v.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = kind(num)
        except ValueError:
            print(
                f"error: {flag} takes DATASET={kind.__name__.upper()}, not {v!r}", file=sys.stderr
            )
            raise SystemExit(EXIT_USAGE) from None
    return out


def _export(args: argparse.Namespace, console: Console) -> int:
    """`regen export`: check the flags, write the export (outputs/exporting.py), say what it
    holds, upload it."""
    from regen.outputs.exporting import export_out_dir
    from regen.view.export import show_export

    pairs = _export_pairs(args)
    if pairs is None:
        return EXIT_USAGE
    to = args.to or args.out / "export" / args.format
    opts = _export_options(args, *pairs)
    done = export_out_dir(
        args.out, to, opts, _target_overrides(args), expect_reasoning=args.expect_reasoning
    )
    _say_on_stderr(done.notes, done.warnings)
    show_export(console, args.format, to, done.manifest)
    if args.push_to_hub:
        from regen.outputs.hub import push_to_hub

        url = push_to_hub(to, args.push_to_hub, private=args.private)
        console.print(f"uploaded to the Hub: {url}", markup=False, highlight=False)
    return EXIT_OK


def _say_on_stderr(notes: list[str], warnings: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _export_pairs(
    args: argparse.Namespace,
) -> tuple[dict[str, object], dict[str, object]] | None:
    """The --weight and --cap pairs, once the flags that need no state.db are checked; None
    (said on stderr) when one is wrong."""
    if not 0 <= args.validation < 1:
        print("error: --validation takes a fraction from 0 to below 1", file=sys.stderr)
        return None
    weights = _pairs(args.weight, "--weight", float)
    caps = _pairs(args.cap, "--cap", int)
    if args.push_to_hub is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+", args.push_to_hub):
        print(f"error: --push-to-hub takes OWNER/NAME, not {args.push_to_hub!r}", file=sys.stderr)
        return None
    return weights, caps


def _export_options(
    args: argparse.Namespace, weights: dict[str, object], caps: dict[str, object]
) -> ExportOptions:
    """The export's options from its flags."""
    from regen.outputs.export import ExportOptions

    return ExportOptions(
        format=args.format,
        keep_truncated=args.keep_truncated,
        keep_empty=args.keep_empty,
        keep_orphans=args.keep_orphans,
        min_completion_tokens=args.min_tokens,
        max_completion_tokens=args.max_tokens,
        exclude_providers=tuple(args.exclude_provider),
        weights={k: float(str(v)) for k, v in weights.items()},
        caps={k: int(str(v)) for k, v in caps.items()},
        validation_fraction=args.validation,
        seed=args.seed,
        dedup=args.dedup,
        since_last=args.since_last,
        shard_rows=max(1, args.shard_rows),
        drop_failed_audit=args.drop_failed_audit,
        max_sample_diff=args.max_sample_diff,
        train_source_turns=args.train_source_turns,
        samples=args.samples,
        license=args.license,
    )


def _providers(args: argparse.Namespace, console: Console) -> int:
    import dataclasses
    import json

    from regen.config import key_from_env
    from regen.engine.providers import verdicts, warnings
    from regen.safe import register_secret
    from regen.view.providers import providers_table

    endpoint, max_tokens = _providers_endpoint(args)
    base_url = (args.base_url or endpoint.base_url).rstrip("/")

    key = key_from_env(endpoint.api_key_env, "api_key_env") or None
    register_secret(key)

    eps = asyncio.run(_fetch_endpoint_list(base_url, key, endpoint, args.model))
    if not eps:
        raise ConfigError(
            f"{base_url}: no endpoints listed for model '{args.model}' (unknown model, or the "
            "catalogue cannot be reached)"
        )
    verdict = verdicts(eps, endpoint.provider, max_tokens)
    notes = warnings(eps, endpoint.provider, verdict) if args.job is not None else []
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "endpoints": [
                        {**dataclasses.asdict(e), "excluded_by": verdict[e.tag]} for e in eps
                    ],
                    "warnings": notes,
                }
            )
        )
        return EXIT_OK
    console.print(providers_table(args.model, eps, verdict, job=args.job is not None))
    for note in notes:
        console.print(f"warning: {note}", markup=False, soft_wrap=True)
    return EXIT_OK


def _providers_endpoint(args: argparse.Namespace) -> tuple[EndpointConfig, int]:
    """The endpoint to ask (the job's named or first one, else the default) and the
    smallest max_tokens the job's lanes ask for (1 without a job)."""
    from regen.config import EndpointConfig, load_job

    if args.job is None:
        return EndpointConfig(), 1
    job = load_job(args.job)
    pool = {e.name: e for e in job.endpoint_pool}
    if args.endpoint is not None and args.endpoint not in pool:
        raise ConfigError(f"{args.job}: no endpoint '{args.endpoint}' (have: {', '.join(pool)})")
    endpoint = pool[args.endpoint] if args.endpoint else job.endpoint_pool[0]
    return endpoint, min(job.lane_max_tokens(lane) for lane in job.lane_list)


async def _fetch_endpoint_list(
    base_url: str, key: str | None, endpoint: EndpointConfig, model: str
) -> list[EndpointInfo]:
    """The catalogue's endpoints for `model`, asked through one connection."""
    from regen.engine.client import ChatClient
    from regen.engine.providers import fetch_endpoints

    async with ChatClient(
        base_url,
        key,
        concurrency=1,
        headers=endpoint.headers,
        follow_redirects_to=endpoint.follow_redirects_to,
    ) as client:
        return await fetch_endpoints(client, model)


def _inspect(args: argparse.Namespace, console: Console) -> int:
    import json

    from regen.config import load_job
    from regen.run.inspection import inspect_dataset, inspection_json
    from regen.view.inspection import inspection_view

    if args.rows < 1 or args.start < 0:
        print("error: --rows takes a number above 0 and --from one of 0 or more", file=sys.stderr)
        return EXIT_USAGE
    ins = inspect_dataset(load_job(args.job), args.dataset, args.rows, args.start)
    if args.json:
        print(json.dumps(inspection_json(ins), ensure_ascii=False))
    else:
        console.print(inspection_view(inspection_json(ins)))
    return EXIT_OK


_EXIT_OF_END = {
    "aborted": EXIT_INTERRUPTED,
    "cap": EXIT_CAP,
    "left": EXIT_ITEMS_LEFT,
    "error": EXIT_USER,
    "failed": EXIT_FAILED_ITEMS,
    "done": EXIT_OK,
}
"""The exit code of each way a run ends (run/summary.py's `Ended.kind`)."""


def _finish(report: object, console: Console) -> int:
    """Show the run's end (view/finish.py) and return its exit code."""
    from regen.run.summary import RunReport, how_it_ended, money_lines, note_lines
    from regen.view.finish import show_run_end
    from regen.view.progress import summary_table

    assert isinstance(report, RunReport)
    ended = how_it_ended(report)
    table = summary_table(report.datasets, report.errors, report.exports)
    notes = note_lines(report)
    show_run_end(
        console, table, report.out_dir, money_lines(report), report.endpoints, notes + ended.lines
    )
    if ended.error is not None:
        print(ended.error, file=sys.stderr)
    return _EXIT_OF_END[ended.kind]


def _sim(args: argparse.Namespace, console: Console) -> int:
    from regen.sim import load_sim_config, start_sim

    config = load_sim_config(args.config)
    overrides = {
        "dialect": args.dialect,
        "served_model": args.served_model_name,
        "credits_usd": args.credits,
    }
    config = config.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if config.served_model is not None and config.model(config.served_model) is None:
        known = ", ".join(m.id for m in config.models)
        raise ConfigError(
            f"--served-model-name {config.served_model}: the sim has no such model (known: {known})"
        )

    async def serve() -> None:
        try:
            running, runner = await start_sim(config, args.host, args.port)
        except OSError as exc:  # a busy port, an address this machine does not have
            raise ConfigError(
                f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                "pick another --port (or stop what uses it)"
            ) from None
        console.print(f"regen sim listening on {running.base_url}", markup=False)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return EXIT_OK


def _demo(args: argparse.Namespace, console: Console) -> int:
    from regen.demo import DEMO_KEY, demo_job
    from regen.run.runner import run_job
    from regen.sim import SimConfig, sim_in_thread

    # time_scale 0.1: simulated latencies run ten times faster than the real provider's.
    with sim_in_thread(SimConfig(seed=7, time_scale=0.1)) as sim:
        console.print(f"simulator on {sim.base_url}", markup=False)
        try:
            job = demo_job(args.out.resolve(), sim.base_url)
        except FileExistsError as exc:
            print(f"error: {exc}; pass --out DIR", file=sys.stderr)
            return EXIT_USER
        with _watched(console) as watch:
            report = run_job(job, shown=watch, api_key=DEMO_KEY)
    code = _finish(report, console)
    _record_exit(job.output_path, code)
    _write_report(job.output_path, console)
    from regen.outputs.audit import audit, audit_json
    from regen.view.finish import demo_audit_line, print_lines

    overall = audit_json(audit(args.out.resolve())[0])["overall"]
    print_lines([demo_audit_line(overall, args.out)], console)
    return code
