"""Kimi-K2.5's TypeScript tool declarations, rebuilt by regen, against the outputs of the
model's own code (kimi_ts_golden.json says where each came from)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from regen.reconstruct.kimi_ts import tools_typescript

GOLDEN = json.loads((Path(__file__).parent / "kimi_ts_golden.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = GOLDEN["cases"]


def test_the_golden_cases_cover_both_origins_and_the_fallback() -> None:
    origins = {c["origin"] for c in CASES}
    assert origins == {"moonshot", "tinker-cookbook"}
    assert sum(c["ts"] is None for c in CASES) >= 5  # schemas the model's code gives up on


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_regen_writes_what_the_model_code_writes(case: dict[str, Any]) -> None:
    assert tools_typescript(case["tools"]) == case["ts"]
