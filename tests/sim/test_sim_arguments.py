"""The simulator's tool-call arguments follow the declared schemas (issue 48): glaive's own
schemas, with arrays, nested objects, bounds and nullable types, were broken by them."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest

from regen.sim.generate import _arguments

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "ingredients": {"type": "array", "items": {"type": "string"}},
            "max_prep_time": {"type": "integer", "minimum": 200, "maximum": 300},
        },
        "required": ["ingredients"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "price": {"type": "number", "exclusiveMinimum": 500},
                    },
                    "required": ["name", "price"],
                },
            },
            "note": {"type": ["string", "null"]},
            "discount": {"type": "number", "minimum": -10, "maximum": -5},
        },
        "required": ["items"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("text_only", [False, True])
def test_the_simulators_arguments_follow_the_declared_schema(
    schema: dict[str, Any], text_only: bool
) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    for seed in range(50):
        args = json.loads(_arguments(random.Random(seed), tool, text_only=text_only))
        jsonschema.validate(args, schema)
