"""The simulator's own time per request on an agent trajectory: the real SWE-agent row of
tests/sources/fixtures/real, each turn's prompt the history so far (as `each_turn` sends them),
sent one after the other to an in-process `regen sim` whose time scale makes the provider's own
time negligible, each turn twice (a short lane's first try and its escalation to a long lane).
What a request then takes is the simulator's work (rendering, tokenizing, drawing the answer),
which on a bench's loaded core adds to every answer's time on the wire.

Run: .venv/bin/python bench/sim_cpu.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The trajectory is read as its test reads it (tests/sim/test_prompt_ids.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import realistic  # noqa: E402 - the bench's own simulator config
from tests.sim.test_prompt_ids import trajectory  # noqa: E402

from regen.sim.config import SimConfig  # noqa: E402
from regen.sim.server import start_sim  # noqa: E402


def turns() -> list[list[dict[str, Any]]]:
    """Each user turn's history of the fixture trajectory."""
    history = trajectory()
    return [history[: k + 1] for k, m in enumerate(history) if m["role"] == "user"]


async def measure(rounds: int) -> list[float]:
    raw = tomllib.loads(realistic.SIM_TOML.format(seed=1, time_scale=0.0001))
    raw.pop("faults")
    running, runner = await start_sim(SimConfig.model_validate(raw))
    took: list[float] = []
    histories = turns()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer bench"}) as session:
            for r in range(rounds):
                for messages in histories:
                    for max_tokens in (300, 4000):  # a short lane's try, then the long lane's
                        body = {
                            "model": "bench/model",
                            "messages": [*messages, {"role": "user", "content": f"round {r}"}],
                            "max_tokens": max_tokens,
                        }
                        t0 = time.perf_counter()
                        async with session.post(
                            running.base_url + "/chat/completions", json=body
                        ) as resp:
                            await resp.read()
                        took.append(time.perf_counter() - t0)
    finally:
        await runner.cleanup()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    took = asyncio.run(measure(args.rounds))
    print(
        f"{len(took)} requests: mean {statistics.mean(took) * 1000:.1f} ms, median "
        f"{statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms of the "
        "simulator's own time each (prompts of 1k-30k tokens)"
    )


if __name__ == "__main__":
    main()
