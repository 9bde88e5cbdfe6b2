"""No number in a job file may be inf or nan: every float field of the job's models, found
by walking them (a field added later is tried too), and the free-form tables sent as JSON."""

from __future__ import annotations

import json
import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from regen.config import Job, RunConfig, load_job
from regen.errors import ConfigError

Loc = tuple[int | str, ...]

BASE: dict[str, Any] = {
    "generation": {"model": "moonshotai/kimi-k2.5"},
    "datasets": [{"name": "chat", "path": "chat.jsonl"}],
}
REQUIRED: dict[str, dict[str, Any]] = {
    "lanes": {"name": "short"},
    "endpoints": {"name": "a", "dialect": "vllm", "base_url": "http://127.0.0.1:9/v1"},
    # A self-hosted server, where every price field is allowed (OpenRouter has no hourly one).
    "endpoint": {"dialect": "vllm", "base_url": "http://127.0.0.1:9/v1"},
    "reconstruct": {"family": "qwen3"},
}


def _shapes(annotation: Any) -> tuple[set[str], list[type[BaseModel]]]:
    """Where a field takes a float (`scalar`, `list`, `dict`, `dict-list`) and which models
    it holds, from its type."""
    shapes: set[str] = set()
    models: list[type[BaseModel]] = []

    def walk(tp: Any, where: str) -> None:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            walk(typing.get_args(tp)[0], where)
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(tp):
                walk(arg, where)
        elif origin is list:
            walk(typing.get_args(tp)[0], "list" if where == "scalar" else f"{where}-list")
        elif origin is dict:
            walk(typing.get_args(tp)[1], "dict")
        elif tp is float or (tp is Any and where.startswith("dict")):
            shapes.add(where)
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            models.append(tp)

    walk(annotation, "scalar")
    return shapes, models


def float_fields(model: type[BaseModel] = Job, loc: Loc = ()) -> list[tuple[Loc, str]]:
    """Every (location, shape) where the job file may hold a float."""
    found: list[tuple[Loc, str]] = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        shapes, models = _shapes(field.annotation)
        is_list = typing.get_origin(field.annotation) is list
        here: Loc = (*loc, name, 0) if is_list else (*loc, name)
        found += [((*loc, name), shape) for shape in sorted(shapes)]
        for sub in models:
            found += float_fields(sub, here)
    return found


def _set(raw: dict[str, Any], loc: Loc, value: Any) -> None:
    node: Any = raw
    for i, part in enumerate(loc[:-1]):
        if isinstance(part, int):
            continue
        nxt = loc[i + 1]
        default = dict(REQUIRED.get(part, {}))
        if isinstance(nxt, int):
            node = node.setdefault(part, [default])[0]
        else:
            node = node.setdefault(part, default)
    node[loc[-1]] = value


def _toml(value: Any) -> str:
    """TOML for the few types a job needs, everything as inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"


def _job_text(raw: dict[str, Any]) -> str:
    return "\n".join(f"{k} = {_toml(v)}" for k, v in raw.items()) + "\n"


def _name(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


CASES = float_fields()


def test_the_walk_finds_the_float_fields_it_must() -> None:
    names = {(_name(loc), shape) for loc, shape in CASES}
    for expected in [
        ("budget.max_cost_usd", "scalar"),
        ("run.timeout_s", "scalar"),
        ("lanes[0].timeout_s", "scalar"),
        ("endpoints[0].weight", "scalar"),
        ("endpoint.usd_per_gpu_hour", "scalar"),
        ("generation.temperature", "list"),
        ("datasets[0].sample", "scalar"),
        ("datasets[0].filter", "dict-list"),
        ("endpoint.extra_body", "dict"),
    ]:
        assert expected in names
    assert len(CASES) >= 30


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize(("loc", "shape"), CASES, ids=[f"{_name(c[0])}:{c[1]}" for c in CASES])
def test_a_number_that_is_not_finite_is_refused_naming_its_field(
    tmp_path: Path, loc: Loc, shape: str, number: float
) -> None:
    raw = json.loads(json.dumps(BASE))
    where = loc
    value: Any = number
    if shape == "list":
        value, where = [0.5, number], (*loc, 1)
    elif shape == "dict":
        value, where = {"x": number}, (*loc, "x")
    elif shape == "dict-list":
        value, where = {"x": [1, number]}, (*loc, "x", 1)
    _set(raw, loc, value)
    job = tmp_path / "job.toml"
    job.write_text(_job_text(raw))
    with pytest.raises(ConfigError) as info:
        load_job(job)
    message = str(info.value)
    assert message == (
        f"{job}: field '{_name(where)}': {number} is not a finite number (give a number, or "
        "leave the field out for its default)"
    )


# Fields that are read only beside others: a cache price is a share of the prompt price.
COMPANIONS: dict[str, dict[str, float]] = {
    "cache_read_usd_per_mtok": {"prompt_usd_per_mtok": 1.0, "completion_usd_per_mtok": 2.0},
    "cache_write_usd_per_mtok": {"prompt_usd_per_mtok": 1.0, "completion_usd_per_mtok": 2.0},
}


def test_the_same_job_with_finite_numbers_loads(tmp_path: Path) -> None:
    """The jobs above fail for their number alone: with 2.0 in its place each one loads."""
    for loc, shape in CASES:
        raw = json.loads(json.dumps(BASE))
        value: Any = {"list": [0.5], "dict": {"x": 2.0}, "dict-list": {"x": [2.0]}}.get(shape, 0.5)
        for name, companion in COMPANIONS.get(str(loc[-1]), {}).items():
            _set(raw, (*loc[:-1], name), companion)
        _set(raw, loc, value)
        (tmp_path / "job.toml").write_text(_job_text(raw))
        load_job(tmp_path / "job.toml")


def test_a_model_built_in_code_refuses_inf_too() -> None:
    with pytest.raises(ValueError, match="finite number"):
        RunConfig(timeout_s=math.inf)


def test_run_with_an_infinite_cap_is_one_line_and_exit_1(tmp_path: Path) -> None:
    from tests.conftest import run_cli, write_job

    job = write_job(tmp_path, "http://127.0.0.1:9/api/v1", datasets=[("chat", "c.jsonl", "openai")])
    job.write_text(job.read_text() + "\n[budget]\nmax_cost_usd = inf\n")
    proc = run_cli("run", str(job))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: {job}: field 'budget.max_cost_usd': inf is not a finite number (give a "
        "number, or leave the field out for its default)\n"
    )
    assert not (tmp_path / "out").exists()
