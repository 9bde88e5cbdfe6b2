"""docs/grafana-dashboard.json: every panel queries what its title says, in the unit it shows.

Each query is parsed (the PromQL the dashboard uses: selectors, rate() and increase(),
aggregations, histogram_quantile(), time(), + - /) and what it computes is worked out from
what the collector serves, read from a scrape (names, types, labels and their values; no list
of names here): a rate of a counter of tokens is tokens/s, a ratio of two rates of events a
share, a gauge of seconds seconds. Counters are read through rate() or increase() (a bare
counter only where the title says it is a running total: "so far"); gauges never are. A
label whose values are different quantities (kind of tokens, outcome, state, quantile) is
never summed over, and the title names each value the panel shows, or says "by <label>".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from regen.view.metrics import exposition
from tests.view.test_metrics import DASHBOARD, fake_stats

UNIT_DIMS = {"seconds": "s", "usd": "usd", "tokens": "tokens"}
"""The unit a metric's name ends with (Prometheus's naming rules) -> its dimension."""
QUANTITY_LABELS = {"kind", "outcome", "state", "quantile"}
"""Labels whose values are different quantities, not parts of one (as `dataset` or `class`)."""
WORDS = {
    "completion": ("completion", "output"),
    "prompt": ("prompt", "input"),
    "0.1": ("p10",),
    "0.5": ("p50", "median"),
    "0.9": ("p90",),
}
"""How a title names a label value (by default: the value itself)."""
RUNNING_TOTAL = re.compile(r"\bso far\b", re.I)
PER_SECOND = re.compile(r"\bper second\b|/s\b", re.I)


@dataclass(frozen=True)
class Served:
    """One sample name the collector serves."""

    counter: bool
    """Only goes up: a counter's `_total`, or a histogram's `_bucket`, `_sum`, `_count`."""
    dims: Counter[str]
    """Exponents of s, usd, tokens; none for a count (items, requests, attempts)."""
    labels: dict[str, set[str]]
    """Label name -> the values served."""
    observes: Counter[str] | None
    """A histogram's buckets: the dimension of what they observe."""


def served() -> dict[str, Served]:
    """What the collector serves, from a scrape of a run in which every metric has a value."""
    out: dict[str, Served] = {}
    for f in text_string_to_metric_families(exposition(fake_stats())):
        last = f.name.split("_")[-1]
        unit = Counter({UNIT_DIMS[last]: 1}) if last in UNIT_DIMS else Counter()
        for s in f.samples:
            # A histogram's _sum adds up what it observes; its _bucket and _count count them.
            counts = s.name.endswith(("_bucket", "_count"))
            observes = unit if s.name.endswith("_bucket") else None
            counter = f.type in ("counter", "histogram")
            entry = out.setdefault(
                s.name, Served(counter, Counter() if counts else unit, {}, observes)
            )
            for k, v in s.labels.items():
                entry.labels.setdefault(k, set()).add(v)
    return out


def exponents(a: Counter[str], b: Counter[str], sign: int) -> Counter[str]:
    """The dimension of a times b (sign 1) or a over b (sign -1)."""
    out = Counter({k: a[k] + sign * b[k] for k in a.keys() | b.keys()})
    return Counter({k: n for k, n in out.items() if n})


@dataclass
class Value:
    """What an expression computes: its dimension, whether it is a ratio of like quantities,
    and the values of quantity labels it shows."""

    dims: Counter[str] = field(default_factory=Counter)
    ratio: bool = False
    shown: set[tuple[str, str]] = field(default_factory=set)
    loose: set[str] = field(default_factory=set)
    """Quantity labels not pinned to one value: summing over them adds unlike things."""
    observes: Counter[str] | None = None
    """A histogram's buckets (kept apart by `le`): the dimension of what they observe."""


TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r'|(?P<str>"[^"]*")|(?P<range>\[[^\]]*\])|(?P<op>=~|!~|!=|[-+*/(){},=]))'
)
AGGREGATIONS = {"sum", "avg", "min", "max"}


class Query:
    """A PromQL expression of a panel, parsed and its Value worked out; what it gets wrong
    goes to `problems`."""

    def __init__(self, expr: str, metrics: dict[str, Served], title: str) -> None:
        self.metrics, self.title = metrics, title
        self.problems: list[str] = []
        self.tokens: list[tuple[str, str]] = []
        pos, end = 0, len(expr.rstrip())
        while pos < end:
            m = TOKEN.match(expr, pos)
            assert m is not None and m.lastgroup is not None, f"cannot read {expr[pos:]!r}"
            self.tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.value = self.additive()
        assert not self.tokens, f"left over in {expr!r}: {self.tokens}"

    def peek(self) -> str | None:
        return self.tokens[0][1] if self.tokens else None

    def take(self, want: str | None = None) -> str:
        _, text = self.tokens.pop(0)
        assert want is None or text == want, (want, text)
        return text

    def additive(self) -> Value:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.multiplicative()
            if left.dims != right.dims:
                self.problems.append(f"{op} of unlike {dict(left.dims)}, {dict(right.dims)}")
            left = Value(
                left.dims,
                left.ratio and right.ratio,
                left.shown | right.shown,
                left.loose | right.loose,
            )
        return left

    def multiplicative(self) -> Value:
        left = self.primary()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.primary()
            if op == "*":
                self.problems.append("a product: the checker does not know its unit")
            left = Value(
                exponents(left.dims, right.dims, -1),
                left.dims == right.dims,
                left.shown | right.shown,
                left.loose | right.loose,
            )
        return left

    def primary(self) -> Value:
        kind, text = self.tokens[0]
        self.take()
        if kind == "num":
            return Value()
        if text == "(":
            v = self.additive()
            self.take(")")
            return v
        assert kind == "name", f"unexpected {text!r}"
        if text in AGGREGATIONS:
            return self.aggregation()
        if text in ("rate", "increase"):
            self.take("(")
            v = self.selector(self.take(), in_rate=True)
            self.take(")")
            if text == "rate":
                v.dims = exponents(v.dims, Counter({"s": 1}), -1)
            return v
        if text == "histogram_quantile":
            self.take("(")
            self.primary()  # which quantile
            self.take(",")
            v = self.additive()
            self.take(")")
            if v.observes is None:
                self.problems.append("histogram_quantile() of what is not buckets kept by `le`")
            return Value(v.observes or Counter(), False, v.shown, v.loose)
        if text == "time":
            self.take("(")
            self.take(")")
            return Value(Counter({"s": 1}))
        return self.selector(text, in_rate=False)

    def label_names(self) -> set[str]:
        self.take("(")
        names = set()
        while self.peek() != ")":
            names.add(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return names

    def aggregation(self) -> Value:
        """sum, avg, min or max, with `by (...)` before or after its argument."""
        kept: set[str] = set()
        if self.peek() == "by":
            self.take()
            kept = self.label_names()
        self.take("(")
        v = self.additive()
        self.take(")")
        if self.peek() == "by":
            self.take()
            kept = self.label_names()
        for label in sorted(v.loose - kept):
            self.problems.append(f"sums over `{label}`, whose values are different quantities")
        v.loose &= kept
        if "le" not in kept:
            v.observes = None
        return v

    def selector(self, name: str, in_rate: bool) -> Value:
        pinned: dict[str, str] = {}
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                label, op, value = self.take(), self.take(), self.take().strip('"')
                if op == "=":
                    pinned[label] = value
                if self.peek() == ",":
                    self.take()
            self.take("}")
        ranged = bool(self.tokens) and self.tokens[0][0] == "range"
        if ranged:
            self.take()
        m = self.metrics.get(name)
        if m is None:
            self.problems.append(f"{name}: not served by the collector")
            return Value()
        if in_rate and not m.counter:
            self.problems.append(f"{name}: a gauge in rate()/increase()")
        if in_rate != ranged:
            self.problems.append(f"{name}: a range only inside rate()/increase()")
        if not in_rate and m.counter and not RUNNING_TOTAL.search(self.title):
            self.problems.append(f"{name}: a counter outside rate()/increase()")
        v = Value(m.dims.copy(), observes=m.observes)
        for label in QUANTITY_LABELS & set(m.labels):
            if label in pinned:
                v.shown.add((label, pinned[label]))
            else:
                v.shown |= {(label, value) for value in m.labels[label]}
                v.loose.add(label)
        return v


def unit_fits(v: Value, unit: str) -> bool:
    """Whether the panel's Grafana unit shows what its query computes."""
    dims = dict(v.dims)
    if not dims:
        if v.ratio:
            return unit == "percentunit"
        return unit in ("short", "none") or re.fullmatch(r"count:[^/]+", unit) is not None
    if dims == {"s": -1}:  # events a second
        return unit in ("cps", "reqps", "ops") or re.fullmatch(r"count:\S+/s", unit) is not None
    if dims == {"tokens": 1, "s": -1}:
        return unit == "count:tokens/s"
    if dims == {"tokens": 1}:
        return unit == "count:tokens"
    if dims == {"usd": 1}:
        return unit == "currencyUSD"
    if dims == {"s": 1}:
        return unit in ("s", "dtdurations", "dthms", "dtdhms")
    return False


def named(title: str, value: str) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", title, re.I) for w in WORDS.get(value, (value,)))


def panel_problems(panel: dict[str, Any], metrics: dict[str, Served]) -> list[str]:
    """Every way a panel's queries do not show what its title and unit say."""
    title, unit = panel["title"], panel["fieldConfig"]["defaults"].get("unit", "")
    queries = [Query(t["expr"], metrics, title) for t in panel["targets"]]
    problems = [p for q in queries for p in q.problems]
    dims = {tuple(sorted(q.value.dims.items())) for q in queries}
    if len(dims) > 1:
        problems.append(f"queries of different units {sorted(dims)} in one panel")
    for q in queries:
        if not unit_fits(q.value, unit):
            problems.append(f"unit {unit!r} for {dict(q.value.dims)} (ratio: {q.value.ratio})")
        if (q.value.dims.get("s") == -1) != bool(PER_SECOND.search(title)):
            problems.append(f"only a rate's title says per second: {dict(q.value.dims)}")
    shown = {pair for q in queries for pair in q.value.shown}
    for label in sorted({label for label, _ in shown}):
        if re.search(rf"\bby {label}\b", title):
            continue
        values = {v for lab, v in shown if lab == label}
        every = set().union(*(m.labels[label] for m in metrics.values() if label in m.labels))
        problems += [
            f"shows {label}={v} but its title does not say so"
            for v in sorted(values)
            if not named(title, v)
        ]
        problems += [
            f"its title names {label}={v} but it does not show it"
            for v in sorted(every - values)
            if named(title, v)
        ]
    return problems


def test_every_panel_queries_what_its_title_says_in_its_unit() -> None:
    metrics = served()
    dash = json.loads(DASHBOARD.read_text())
    problems = {p["title"]: panel_problems(p, metrics) for p in dash["panels"]}
    assert {title: found for title, found in problems.items() if found} == {}


def panel(title: str, unit: str, *exprs: str) -> dict[str, Any]:
    return {
        "title": title,
        "fieldConfig": {"defaults": {"unit": unit}},
        "targets": [{"expr": e} for e in exprs],
    }


def test_the_checker_catches_a_panel_that_shows_something_else() -> None:
    metrics = served()
    # The dashboard's own bug: "output" tokens that were prompt and completion tokens.
    both = "sum by (dataset, kind) (rate(regen_tokens_total[5m]))"
    prompt = 'rate(regen_tokens_total{kind="prompt"}[5m])'
    wrong = {
        "shows kind=prompt but its title does not say so": panel(
            "Output tokens per second", "count:tokens/s", both
        ),
        "unit 'short'": panel("Completion tokens per second", "short", both),
        "sums over `kind`": panel(
            "Prompt and completion tokens per second",
            "count:tokens/s",
            "sum(rate(regen_tokens_total[5m]))",
        ),
        "its title names kind=completion but it does not show it": panel(
            "Prompt and output tokens per second", "count:tokens/s", prompt
        ),
        "regen_answers_total: a counter outside": panel(
            "Answers", "short", "sum(regen_answers_total)"
        ),
        "regen_items: a gauge in rate": panel(
            "Items per second", "count:items/s", "rate(regen_items[5m])"
        ),
        "regen_widgets: not served": panel("Widgets", "short", "regen_widgets"),
        "unit 'currencyUSD'": panel("Tokens so far", "currencyUSD", "sum(regen_tokens_total)"),
        "only a rate's title says per second": panel("Prompt tokens", "count:tokens/s", prompt),
        "unit 'short' for {} (ratio: True)": panel(
            "Failed attempts per answer",
            "short",
            "sum(rate(regen_attempt_errors_total[5m])) / sum(rate(regen_answers_total[5m]))",
        ),
        "not buckets kept by `le`": panel(
            "Latency",
            "s",
            "histogram_quantile(0.5, sum(rate(regen_request_latency_seconds_bucket[5m])))",
        ),
        "- of unlike": panel("Spent so far", "currencyUSD", "regen_cost_usd_total - time()"),
    }
    for expected, p in wrong.items():
        found = panel_problems(p, metrics)
        assert any(expected in problem for problem in found), (expected, found)
