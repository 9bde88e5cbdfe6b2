"""Which faults hit a request: drawn by configured rates, or forced by `X-Sim-Fault`.

The draw is seeded by the request's content *and* how many times the same request was seen,
so a retry of a failed request can succeed while every run of a test sees the same faults.
"""

from __future__ import annotations

import random

from regen.sim.config import FAULT_KINDS, SimFaults

# At most one of these per request: each ends the request its own way.
TERMINAL = ("http_5xx", "408", "429", "error_200", "reset", "midstream_error", "cold_start")


def forced_faults(header: str | None) -> set[str] | str:
    """The kinds named in the header, or the error message for an unknown kind."""
    if not header:
        return set()
    kinds = {k.strip() for k in header.split(",") if k.strip()}
    unknown = sorted(kinds - set(FAULT_KINDS))
    if unknown:
        return f"unknown X-Sim-Fault kind(s) {unknown} (allowed: {', '.join(FAULT_KINDS)})"
    return kinds


def draw_faults(cfg: SimFaults, rng: random.Random) -> set[str]:
    """Faults by rate: one terminal fault at most, plus the harmless quirks."""
    out: set[str] = set()
    roll = rng.random()
    for kind, rate in (
        ("http_5xx", cfg.http_5xx),
        ("408", cfg.http_408),
        ("error_200", cfg.error_200),
        ("reset", cfg.reset),
        ("midstream_error", cfg.midstream_error),
        ("cold_start", cfg.cold_start),
    ):
        if roll < rate:
            out.add(str(rng.choice(cfg.http_5xx_codes)) if kind == "http_5xx" else kind)
            break
        roll -= rate
    if rng.random() < cfg.stall:
        out.add("stall")
    if rng.random() < cfg.padding:
        out.add("padding")
    if rng.random() < cfg.keepalive:
        out.add("keepalive")
    if cfg.misroute and rng.random() < cfg.misroute:  # drawn only when set: seeds stay put
        out.add("misroute")
    return out
