"""A lying provider, longer (issue 46): the trials of tests/engine/test_lying_provider.py drawn many
times with fresh seeds, and a table of what they did.

Each trial puts one to three lies (a price, a usage field, a /generation record, /key,
/credits or a key record of the management API given -5, 1e18, NaN, a numeric string, null,
or left out, on a share of the records: tests/lying_proxy.py) between `regen run` and the
simulator, and meets them with two or three runs, some killed with -9 at a commit and rerun
at once, the last told the truth. It checks, against what the simulator billed: (a) the
job's and the dataset's dollar caps and the token budget's bound, (b) no traceback,
documented exit codes, a refusal in one line, (c) no run waits for a held request's
deadline, (d) the last run ends done or at its real caps, (e) no answer billed and sent whole
to a run that was not killed is dropped.

`--matrix` tries every (channel, field, value) alone instead, on all records, with a run
killed at its 3rd commit, a lying rerun and a truthful last run: which lie breaks what.

    .venv/bin/python bench/lying.py [--examples 200] [--seed 1] [--json]
    .venv/bin/python bench/lying.py --matrix [--channels generation chat]

Exit status 1 when a trial breaks an invariant.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# The trials and the proxy live with the test that runs them in the suite.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from simproc import machine_line  # noqa: E402
from tests.engine import test_lying_provider as lying  # noqa: E402
from tests.engine.test_lying_provider import (  # noqa: E402
    CHAT_CAP,
    JOB_CAP,
    KILLED_THEN_LYING,
    MORE_BUDGET,
    TOKEN_BOUND,
    Outcome,
    Trial,
    play,
    tail,
    trials,
)
from tests.lying_proxy import CHANNELS, FIELDS, HOSTILE, Lie  # noqa: E402


def drawn(n: int, seed: int, on_outcome: Any) -> None:
    """Play the distinct trials among `n` drawn by hypothesis from `seed` (no shrinking:
    every one is kept)."""
    seen: set[str] = set()

    @settings(
        max_examples=n,
        derandomize=False,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(trial=trials())
    def one(trial: Trial) -> None:
        if str(trial) not in seen:  # hypothesis may draw one twice (the simplest, first)
            seen.add(str(trial))
            on_outcome(play(trial))

    hypothesis_seed(seed)(one)()


def matrix(channels: list[str], on_outcome: Any) -> None:
    """Every lie alone, on every record of its channel."""
    for channel in channels:
        for name in FIELDS[channel]:
            for value in HOSTILE:
                lie = Lie(channel, name, value)
                # /credits and the key records are read only with a management key.
                managed = channel in ("credits", "keys")
                on_outcome(play(Trial((lie,), KILLED_THEN_LYING, managed)))


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    runs = [r for o in outcomes for r in o.runs]
    drawn_on: Counter[str] = Counter(lie.channel for o in outcomes for lie in o.trial.lies)
    told: Counter[str] = Counter()
    for o in outcomes:
        told.update(o.told)
    broken: defaultdict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        for kind in sorted({f[:3] for f in o.failures}):
            broken[kind].append(str(o.trial))
    return {
        "trials": len(outcomes),
        "runs": len(runs),
        "kills": sum(o.kills for o in outcomes),
        "managed_trials": sum(o.trial.managed for o in outcomes),
        "lies_drawn_per_channel": {c: drawn_on[c] for c in CHANNELS},
        "lies_told_per_channel": {c: told[c] for c in CHANNELS},
        "max_billed_over_job_cap": max((o.billed_usd / JOB_CAP for o in outcomes), default=0),
        "max_billed_over_chat_cap": max(
            (o.billed_chat_usd / CHAT_CAP for o in outcomes), default=0
        ),
        "max_token_overshoot": max((o.more_tokens - MORE_BUDGET for o in outcomes), default=0),
        "token_overshoot_bound": TOKEN_BOUND,
        "runs_with_a_traceback": sum("Traceback" in r.output for r in runs),
        "exit_codes": dict(Counter(str(r.code) for r in runs)),
        "longest_rerun_s": round(max((o.longest_rerun_s for o in outcomes), default=0), 1),
        "trials_breaking": {k: len(v) for k, v in sorted(broken.items())},
        "failing_trials": [
            {"trial": str(o.trial), "failures": o.failures} for o in outcomes if o.failures
        ],
    }


def show(s: dict[str, Any]) -> None:
    cap = f"{s['max_billed_over_job_cap']:.2f}x job cap, {s['max_billed_over_chat_cap']:.2f}x"
    rows = [
        ("trials (managed keys)", f"{s['trials']} ({s['managed_trials']})"),
        ("runs, of them killed at a commit", f"{s['runs']}, {s['kills']}"),
        ("lies drawn per channel", _pairs(s["lies_drawn_per_channel"])),
        ("records rewritten per channel", _pairs(s["lies_told_per_channel"])),
        ("max billed / cap", f"{cap} dataset cap"),
        (
            "max token overshoot (bound)",
            f"{s['max_token_overshoot']} ({s['token_overshoot_bound']})",
        ),
        ("runs with a traceback", str(s["runs_with_a_traceback"])),
        ("exit codes", _pairs(s["exit_codes"])),
        ("longest rerun", f"{s['longest_rerun_s']} s"),
        ("trials breaking (a)-(e)", _pairs(s["trials_breaking"]) or "none"),
    ]
    print("| | |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for f in s["failing_trials"]:
        print(f"\n{f['trial']}\n  " + "\n  ".join(f["failures"]))


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--matrix", action="store_true", help="every lie alone instead")
    ap.add_argument("--channels", nargs="*", default=list(CHANNELS), choices=CHANNELS)
    ap.add_argument(
        "--bound-s",
        type=float,
        default=lying.RUN_BOUND_S,
        help="a run still going after this long idles (its holds' deadlines are 360 s away)",
    )
    ap.add_argument("--verbose", action="store_true", help="each failing run's last lines")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lying.RUN_BOUND_S = args.bound_s
    outcomes: list[Outcome] = []
    started = time.monotonic()

    def record(o: Outcome) -> None:
        outcomes.append(o)
        verdict = "; ".join(o.failures) or "ok"
        print(f"[{len(outcomes)}] {o.trial}: {verdict}", file=sys.stderr, flush=True)
        if args.verbose and o.failures:
            for i, r in enumerate(o.runs):
                print(f"  run {i + 1}: exit {r.code}\n{tail(r.output)}", file=sys.stderr)

    if args.matrix:
        matrix(args.channels, record)
    else:
        drawn(args.examples, args.seed, record)
    s = summary(outcomes)
    if args.json:
        print(json.dumps(s, indent=1))
        return 1 if s["failing_trials"] else 0
    print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"date: {time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - started:.0f} s")
    print(machine_line())
    print()
    show(s)
    return 1 if s["failing_trials"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
