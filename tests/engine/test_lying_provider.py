"""A provider that lies about numbers (issue 46): prices, usage, bills, credit. Whole `regen run`
processes, killed with -9 and run again, through `tests/lying_proxy.py` in front of the
simulator, checked against what the simulator billed (the truth, not regen's ledger):

(a) what was billed stays within every dollar cap, and a token budget within its bound;
(b) no traceback, every exit code one that docs/design.md lists, a refusal in one line;
(c) no run idles at its holds until their deadlines;
(d) once the provider stops lying, the job ends done or at its real caps: no bad number
    blocks it for good;
(e) no answer the provider billed and sent whole to a run that was not killed is dropped
    (and bought again): a lie about its usage flags the answer, it does not lose it.

`bench/lying.py` runs the same trials longer."""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from regen.sim import SimConfig, sim_in_thread
from regen.sim.server import LoggedRequest
from tests.conftest import SECRET_KEY, chat_rows, fuzz_examples, query, write_rows
from tests.lying_proxy import CHANNELS, FIELDS, HOSTILE, REMOVED, Lie, lying_proxy

JOB_CAP = 0.05
CHAT_CAP = 0.02
"""USD: the job's cap, and the first dataset's own."""
MORE_BUDGET = 8_000
"""Completion tokens: the second dataset's budget. The third dataset has no limit of its own:
the job's cap ends it."""
SHORT = (8, 256)
LONG = (4, 1024)
"""(concurrency, max_tokens) of the short lane (not streamed) and the long one (streamed)."""
TOKEN_BOUND = SHORT[0] * SHORT[1] + LONG[0] * LONG[1]
"""A token budget may be passed by what one run has in flight at its last admission."""
LANE_TIMEOUT_S = 300.0
RUN_BOUND_S = 150.0
"""No run of this small job takes this long, unless it waits for a held request's deadline
(its lane's timeout and a minute): the bound needs no tuning to the machine's speed."""
# A trial stops at its first run past the bound: a test fails in minutes, not hours.
pytestmark = pytest.mark.timeout(3 * RUN_BOUND_S + 120)
TOP_PRICES = (0.6e-6, 2.5e-6)
"""The simulator's highest prompt and completion prices for the model (USD per token)."""
WORST_USD = LONG[1] * TOP_PRICES[1] + 1_000 * TOP_PRICES[0]
"""More than any one request of this job can cost, or regen can hold for it: the long lane's
max_tokens and a prompt of 1,000 tokens (regen's bound on a prompt of some 20 tokens counts
its bytes and room for the template: "the next request could cost up to $0.0027"), at the
highest prices."""
EXITS = {0, 1, 2, 3, 4, 5}
"""docs/design.md, "Ends and damage"; 1 and 2 are a refusal (bad config or input)."""


@dataclass(frozen=True)
class Run:
    """One `regen run`: through the lies or not, killed at its Nth commit or not."""

    lies: bool
    crash_at: int | None = None


@dataclass(frozen=True)
class Trial:
    """Lies, the runs that meet them, on keys of the job's own or not, and the sim's seed."""

    lies: tuple[Lie, ...]
    runs: tuple[Run, ...]
    managed: bool = False
    """A management key: each run makes a key of its own (and reads /credits)."""
    seed: int = 0

    def __str__(self) -> str:
        runs = " ".join(
            ("L" if r.lies else "-") + (f"k{r.crash_at}" if r.crash_at else "") for r in self.runs
        )
        managed = " managed" if self.managed else ""
        return f"[{', '.join(map(str, self.lies))}] runs {runs}{managed} seed {self.seed}"


@dataclass
class RunResult:
    run: Run
    code: int | None
    """The exit code; -9 when killed at its failpoint; None when it passed RUN_BOUND_S."""
    seconds: float
    output: str
    sent: int = 0
    """Chat requests the simulator received during the run."""
    answered: set[str] = field(default_factory=set)
    """Generation ids of the answers the simulator billed and sent whole during the run."""


@dataclass
class Outcome:
    """What a trial did, and which invariants it broke."""

    trial: Trial
    runs: list[RunResult]
    billed_usd: float
    billed_chat_usd: float
    more_tokens: int
    told: Counter[str]
    """Lies told, per channel."""
    failures: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(r.code == -signal.SIGKILL for r in self.runs)

    @property
    def longest_rerun_s(self) -> float:
        return max((r.seconds for r in self.runs[1:]), default=0.0)


MANAGEMENT_KEY = "sk-or-v1-lying-management-not-a-secret"


def job_file(tmp: Path, base_url: str, managed: bool = False) -> Path:
    """Three datasets (the first with its own dollar cap, the second with a token budget, the
    third ended by the job's cap), a short lane escalating to a streamed long one."""
    write_rows(tmp / "chat.jsonl", chat_rows(60))
    write_rows(tmp / "more.jsonl", chat_rows(40, prefix="More"))
    write_rows(tmp / "rest.jsonl", chat_rows(60, prefix="Rest"))
    job = tmp / "job.toml"
    key = 'management_key_env = "REGEN_TEST_MGMT"' if managed else 'api_key_env = "REGEN_TEST_KEY"'
    job.write_text(
        f"""
[job]
name = "lying"
output_dir = "out"

[endpoint]
base_url = "{base_url}"
{key}

[generation]
model = "moonshotai/kimi-k2.5"
max_tokens = {LONG[1]}

[run]
initial_limit = {SHORT[0]}
timeout_s = {LANE_TIMEOUT_S}
progress_interval_s = 0.5
stop_grace_s = 20

[budget]
max_cost_usd = {JOB_CAP}
stop_when_credits_below = 1.0
credit_poll_s = 1

[[lanes]]
name = "short"
concurrency = {SHORT[0]}
max_tokens = {SHORT[1]}
escalate_to = "long"

[[lanes]]
name = "long"
concurrency = {LONG[0]}
max_tokens = {LONG[1]}
stream = true

[[datasets]]
name = "chat"
path = "chat.jsonl"
max_cost_usd = {CHAT_CAP}

[[datasets]]
name = "more"
path = "more.jsonl"
token_budget = {MORE_BUDGET}

[[datasets]]
name = "rest"
path = "rest.jsonl"
"""
    )
    return job


def run_regen(job: Path, run: Run) -> RunResult:
    env = {**os.environ, "REGEN_TEST_KEY": SECRET_KEY, "REGEN_TEST_MGMT": MANAGEMENT_KEY}
    env.pop("REGEN_CRASH_AT", None)
    if run.crash_at is not None:
        env["REGEN_CRASH_AT"] = f"commit:{run.crash_at}"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen", "run", str(job)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    code: int | None = None
    try:
        out, _ = proc.communicate(timeout=RUN_BOUND_S)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        if proc.poll() is None:  # past the bound, or the test itself was stopped
            proc.kill()
            out += proc.communicate()[0]
    return RunResult(run, code, time.monotonic() - started, out)


def dataset_of(entry: LoggedRequest) -> str:
    text = str((entry.body or {"messages": [{}]})["messages"][-1].get("content", ""))
    return {"More": "more", "Rest": "rest"}.get(text[:4], "chat")


def play(trial: Trial) -> Outcome:
    """Run the trial's runs against a fresh simulator behind the lying proxy; check them."""
    config = SimConfig(
        seed=trial.seed,
        time_scale=0.05,
        log_bodies=True,
        generation_delay_s=0.2,
        credits_usd=92.0,
        management_keys=[MANAGEMENT_KEY] if trial.managed else [],
    )
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        sim_in_thread(config) as sim,
        lying_proxy(sim.base_url, seed=trial.seed) as proxy,
    ):
        tmp = Path(tmp_name)
        job = job_file(tmp, proxy.base_url, trial.managed)
        results = []
        spans = []
        for run in trial.runs:
            proxy.lies = list(trial.lies) if run.lies else []
            before = len(sim.simulator.chat_log())
            results.append(run_regen(job, run))
            spans.append((before, len(sim.simulator.chat_log())))
            if results[-1].code is None:
                break  # it idled: the rest of the trial would only wait again
        sim.simulator.wait_billed(60)
        log = sim.simulator.chat_log()
        for r, (start, end) in zip(results, spans, strict=True):
            r.sent = end - start
            r.answered = {
                e.generation_id
                for e in log[start:end]
                if e.billed and e.status == 200 and e.generation_id
            }
        billed = Counter[str]()
        tokens = Counter[str]()
        for e in log:
            if e.billed:
                billed[dataset_of(e)] += e.cost_usd
                tokens[dataset_of(e)] += e.completion_tokens
        outcome = Outcome(
            trial,
            results,
            sum(billed.values()),
            billed["chat"],
            tokens["more"],
            Counter(r.channel for r in proxy.told()),
        )
        outcome.failures = broken(outcome, tmp / "out")
    return outcome


def broken(o: Outcome, out: Path) -> list[str]:
    """The invariants the outcome breaks, each as one line."""
    fails = []
    if o.billed_usd > JOB_CAP + 1e-9:
        fails.append(f"(a) job billed ${o.billed_usd:.4f} on a ${JOB_CAP} cap")
    if o.billed_chat_usd > CHAT_CAP + 1e-9:
        fails.append(f"(a) chat billed ${o.billed_chat_usd:.4f} on its ${CHAT_CAP} cap")
    if o.more_tokens > MORE_BUDGET + TOKEN_BOUND:
        fails.append(f"(a) more billed {o.more_tokens} tokens on a {MORE_BUDGET} budget")
    kept = {g for (g,) in query(out, "SELECT generation_id FROM results")} | {
        g for (g,) in query(out, "SELECT generation_id FROM ledger WHERE kind = 'escalated'")
    }
    for i, r in enumerate(o.runs):
        dropped = r.answered - kept if r.code in EXITS else set()
        if dropped:
            fails.append(f"(e) run {i + 1} dropped {len(dropped)} answers it was billed for")
        if "Traceback" in r.output:
            fails.append(f"(b) run {i + 1} printed a traceback")
        if r.code is None:
            fails.append(f"(c) run {i + 1} still running after {RUN_BOUND_S:.0f} s")
        elif r.code not in EXITS and not (r.code == -signal.SIGKILL and r.run.crash_at):
            fails.append(f"(b) run {i + 1} exited {r.code}")
        elif r.code in (1, 2) and len(errors(r.output)) != 1:
            fails.append(f"(b) run {i + 1} refused with {len(errors(r.output))} error lines")
    last = o.runs[-1]
    if last.code is None:
        pass  # (c) says so; no run was told the truth
    elif last.code not in (0, 4):
        tail = last.output.strip().splitlines()[-1:] or [""]
        fails.append(f"(d) the run without lies exited {last.code}: {tail[0]}")
    else:
        fails += blocked(out, last.code)
    return fails


def errors(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def blocked(out: Path, code: int) -> list[str]:
    """After the last run: regen's books hold no charge that a true bill could not be
    (negative, not finite, more than one request's worst case), and a scope it counts as met
    has less room left than one request: no bad number stands in for spend."""
    charges = query(out, "SELECT dataset, cost_usd, completion_tokens FROM ledger")
    held = query(out, "SELECT dataset, worst_usd, tokens FROM outstanding")
    pending = {ds for (ds,) in query(out, "SELECT dataset FROM items WHERE status = 'pending'")}
    fails = []
    absurd = [
        (cost, n)
        for _, cost, n in charges
        if not (cost is None or 0 <= cost <= WORST_USD) or not 0 <= n <= 2 * LONG[1]
    ]
    if absurd:
        fails.append(f"(d) {len(absurd)} charges no request can cost, e.g. {absurd[0]}")
    usd: defaultdict[str, float] = defaultdict(float)
    tokens: defaultdict[str, float] = defaultdict(float)
    for ds, cost, n in charges + held:
        usd[ds] += cost or 0.0
        tokens[ds] += n
    job = sum(usd.values())
    if code == 4 and JOB_CAP - job > WORST_USD:
        fails.append(f"(d) stopped at the job's cap with ${JOB_CAP - job:.4f} of it left")
    if "chat" in pending and CHAT_CAP - usd["chat"] > WORST_USD and JOB_CAP - job > WORST_USD:
        fails.append(f"(d) chat left at its cap with ${CHAT_CAP - usd['chat']:.4f} of it left")
    if "more" in pending and tokens["more"] < MORE_BUDGET and JOB_CAP - job > WORST_USD:
        fails.append(f"(d) more left with {MORE_BUDGET - tokens['more']:.0f} tokens of its budget")
    return fails


@st.composite
def trials(draw: st.DrawFn) -> Trial:
    """One lie alone, or two or three on different channels (so never an all-zero
    /generation record, which is OpenRouter's "not billed"), met by two or three runs: the
    first through the lies, perhaps killed; perhaps a second, lying or not, perhaps killed; a
    last one told the truth."""
    channels = draw(
        st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=3, unique=True)
        | st.sampled_from(CHANNELS).map(lambda c: [c])
    )
    lies = tuple(
        Lie(c, draw(st.sampled_from(FIELDS[c])), draw(st.sampled_from(HOSTILE)), share)
        for c in channels
        for share in [draw(st.sampled_from((1.0, 0.3)))]
    )
    # Written so that the simplest draw is the harshest: a kill, then a rerun that lies too
    # (the /generation records of the killed run's requests are read there).
    kill = st.integers(3, 30) | st.none()
    runs = [Run(True, draw(kill))]
    if not draw(st.booleans()):
        runs.append(Run(not draw(st.booleans()), draw(kill)))
    runs.append(Run(False))
    # /credits and the key records are read only with a management key.
    managed = draw(st.booleans()) or bool({"credits", "keys"} & set(channels))
    return Trial(lies, tuple(runs), managed, draw(st.integers(0, 3)))


def explain(o: Outcome) -> str:
    runs = "\n".join(
        f"--- run {i + 1} ({r.run}): exit {r.code} in {r.seconds:.1f} s\n{tail(r.output)}"
        for i, r in enumerate(o.runs)
    )
    return f"{o.trial}\n" + "\n".join(o.failures) + f"\n{runs}"


def tail(output: str, lines: int = 14) -> str:
    """The last lines of a run's output, without its tables and progress lines."""
    kept = [ln for ln in output.splitlines() if ln[:1] not in BOX and not PROGRESS.match(ln)]
    return "\n".join(kept[-lines:])


BOX = {chr(c) for c in range(0x2500, 0x2580)}
PROGRESS = re.compile(r"\d{4}-\d\d-\d\dT\S+ progress ")


# Each example is two or three `regen run` processes (about 5 s each): a few examples, and no
# shrinking, which would replay failing ones many times over. The failure message names the
# lies and each run's end instead.
@settings(
    max_examples=fuzz_examples(6),
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
@pytest.mark.slow
@pytest.mark.timeout((fuzz_examples(6) + 1) * (3 * RUN_BOUND_S + 60))
@given(trial=trials())
def test_no_lie_about_a_number_takes_a_job_past_its_caps_or_blocks_it(trial: Trial) -> None:
    outcome = play(trial)
    assert not outcome.failures, explain(outcome)


# The findings of issue 46, each as it was found (a proxy rewriting an OpenRouter-style
# provider's numbers), with the outcome regen now promises.

EVERY_PRICE = ("completion", "prompt")
KILLED_THEN_LYING = (Run(True, 3), Run(True), Run(False))
"""A run killed at its 3rd commit with requests in flight; a rerun that reads their bills
from /generation through the lies; a last run told the truth."""


def lies(channel: str, value: Any, *fields: str, **kw: Any) -> tuple[Lie, ...]:
    return tuple(Lie(channel, f, value, **kw) for f in fields)


def said_once(output: str, name: str) -> list[str]:
    """The lines of a run's output that name `name`."""
    return [ln for ln in output.splitlines() if name in ln and not PROGRESS.match(ln)]


def refused_at_start(o: Outcome) -> None:
    """The first run (through the lies) refused with one line and sent nothing; the next,
    told the truth, ran to the caps."""
    first = o.runs[0]
    assert first.code in (1, 2) and first.sent == 0, explain(o)
    assert not o.failures, explain(o)  # (b): the refusal is one line
    assert "price" in errors(first.output)[0], explain(o)
    assert o.runs[-1].sent > 0, explain(o)


@pytest.mark.parametrize("price", ["-1", "0"])
def test_a_catalogue_price_below_zero_or_zero_on_every_endpoint_refuses_the_run(
    price: Any,
) -> None:
    """ "-1" on every endpoint switched the hard cap off: all 600 items sent, $3.50 billed on
    a $0.50 cap, exit 0; "0" billed $1.27. No endpoint has a price a worst case can rest on:
    a run with a dollar cap refuses at start."""
    o = play(Trial(lies("catalogue", price, *EVERY_PRICE), (Run(True), Run(False))))
    assert o.told["catalogue"] >= 8
    refused_at_start(o)


def test_an_endpoint_that_hides_its_price_does_not_lower_the_worst_case() -> None:
    """The dearest endpoint lists 0: its answers must still fit the caps (the worst cases
    rest on prices that are valid, and bills above them raise them)."""
    o = play(Trial(lies("catalogue", "0", *EVERY_PRICE, where="Moonshot"), (Run(True), Run(False))))
    assert o.told["catalogue"] >= 2
    assert not o.failures, explain(o)


def test_a_negative_generation_cost_frees_no_room() -> None:
    """/generation's total_cost of -5 was charged as it was: 35 charges of -$5 freed cap
    room, $3.78 billed on a $0.50 cap, exit 0. It is charged at the held request's worst
    case, and the run says so once, naming the provider and the field."""
    o = play(Trial(lies("generation", -5, "total_cost"), KILLED_THEN_LYING))
    assert o.told["generation"] > 0, explain(o)
    assert not o.failures, explain(o)
    named = said_once(o.runs[1].output, "total_cost")
    assert 1 <= len(named) <= 2, explain(o)
    assert any(p in named[0] for p in ("DeepInfra", "Fireworks", "Moonshot AI")), named


@pytest.mark.parametrize("field", ["completion_tokens", "cost"])
def test_usage_of_1e18_blocks_no_later_run(field: str) -> None:
    """Usage of 1e18 tokens for max_tokens = 50 was accepted, and every later run refused
    under any cap. The answer is kept and charged at its worst case."""
    o = play(Trial(lies("chat", 1e18, field), (Run(True), Run(False))))
    assert o.told["chat"] > 0
    assert not o.failures, explain(o)
    assert said_once(o.runs[0].output, field), explain(o)


@pytest.mark.parametrize("field", ["tokens_completion", "total_cost"])
def test_a_generation_record_of_1e18_blocks_no_later_run(field: str) -> None:
    o = play(Trial(lies("generation", 1e18, field), KILLED_THEN_LYING))
    assert o.told["generation"] > 0, explain(o)
    assert not o.failures, explain(o)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_bill_of_nan_or_infinity_is_charged_at_once(value: float) -> None:
    """NaN or Infinity were never charged, and the rerun idled at its holds until their
    deadlines (here 6 minutes: a lane's timeout and one more). A junk record is charged at
    the held request's worst case at once."""
    o = play(Trial(lies("generation", value, "total_cost"), KILLED_THEN_LYING))
    assert o.told["generation"] > 0, explain(o)
    assert not o.failures, explain(o)  # (c): no run past RUN_BOUND_S


def test_an_answer_whose_usage_says_nan_is_kept() -> None:
    """Found with this proxy: a bare NaN in an answer's usage (as Python's json writes it)
    made the whole body unreadable. Every answer became a failed attempt whose bill was
    charged and whose item stays to be bought again: the job's $0.05 spent, nothing kept. The
    answer is kept and flagged, and charged at its worst case."""
    o = play(Trial(lies("chat", math.nan, "cost"), (Run(True), Run(False))))
    assert o.told["chat"] > 0
    assert not o.failures, explain(o)


def test_the_proxy_changes_nothing_but_the_numbers_it_is_told() -> None:
    """The harness's own check: without lies every byte and header the simulator sends comes
    through (streams too), and a lie changes only its field, written as Python's json does."""
    asyncio.run(compare_through_the_proxy())


async def compare_through_the_proxy() -> None:
    config = SimConfig(seed=2, time_scale=0.05, generation_delay_s=0.0, credits_usd=5.0)
    with sim_in_thread(config) as sim, lying_proxy(sim.base_url) as proxy:
        headers = {"Authorization": f"Bearer {SECRET_KEY}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for stream in (False, True):
                body = {
                    "model": "moonshotai/kimi-k2.5",
                    "max_tokens": 60,
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"explain streams {stream}"}],
                }
                url = "/chat/completions"
                (direct, gen), (proxied, _) = [
                    await fetch(http, base + url, body) for base in (sim.base_url, proxy.base_url)
                ]
                # The same request twice: the sim answers the same, but for its ids and times.
                assert strip_ids(proxied) == strip_ids(direct)
                for path in (f"/generation?id={gen}", "/key", "/models", EP_PATH):
                    assert await fetch(http, proxy.base_url + path) == await fetch(
                        http, sim.base_url + path
                    )
            proxy.lies = [Lie("chat", "cost", math.nan), Lie("catalogue", "prompt", REMOVED)]
            (text, _) = await fetch(http, proxy.base_url + "/chat/completions", body)
            assert '"cost": NaN' in text and text.count("NaN") == 1
            (text, _) = await fetch(http, proxy.base_url + EP_PATH)
            assert '"prompt"' not in text and text.count('"completion"') == 4
    assert [(r.channel, r.field) for r in proxy.told()] == [("chat", "cost")] + [
        ("catalogue", "prompt")
    ] * 4


EP_PATH = "/models/moonshotai/kimi-k2.5/endpoints"


async def fetch(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None
) -> tuple[str, str | None]:
    """A response's status, headers that matter, and body, as text; and its generation id."""
    call = http.post(url, json=body) if body is not None else http.get(url)
    async with call as resp:
        text = await resp.text()
        kept = {k: resp.headers.get(k) for k in ("Content-Type", "X-Generation-Id")}
    return f"{resp.status} {kept.get('Content-Type')}\n{text}", kept["X-Generation-Id"]


def strip_ids(text: str) -> str:
    return re.sub(r'gen-\d+-\w+|"created": \d+', "", text)
