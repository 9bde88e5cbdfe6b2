"""Kimi-K2.5's tool declarations: the TypeScript-style `namespace functions { ... }` text its
tokenizer code passes to the chat template as `tools_ts_str` (the template prefers it to JSON).

Written from the observed behaviour of Moonshot's code (tests/reconstruct/kimi_ts_golden.json
holds its outputs, with their source), so regen renders K2.5 prompts without running remote
code. The tokenizer sorts every key of the tools first; a schema the conversion cannot take
makes it give up, and the template then writes JSON: `tools_typescript` returns None then.
"""

from __future__ import annotations

import json
from typing import Any

_HEADER = "# Tools\n\n## functions\nnamespace functions {\n"
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
_IN_LIST = {"object": "{}", "array": "Array<any>", "integer": "number"}
_LIST_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}


class _Unsupported(ValueError):
    """A schema the tokenizer's conversion rejects."""


def sorted_keys(value: Any) -> Any:
    """Every dict's keys in order, recursively (lists keep theirs)."""
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def tools_typescript(tools: list[Any]) -> str | None:
    """The `tools_ts_str` of a tools list, or None where the template falls back to JSON."""
    try:
        blocks = [
            _Function(t["function"]).render()
            for t in sorted_keys(tools)
            if isinstance(t, dict) and t.get("type") == "function" and t.get("function")
        ]
    except (_Unsupported, KeyError, TypeError, AttributeError):
        return None
    if not blocks:
        return None
    return _HEADER + "\n".join(blocks) + "\n}\n"


def _comment(text: str, indent: str) -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _scalar(value: Any) -> str:
    """A default as the tokenizer prints it: Python's repr for numbers and booleans."""
    if isinstance(value, bool | int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _enum_ok(value: Any, kind: Any) -> bool:
    if kind is None:
        return True
    if isinstance(kind, list):
        if len(kind) != 2 or "null" not in kind:
            raise _Unsupported(f"enum with types {kind}")
        other = kind[0] if kind[1] == "null" else kind[1]
        return value is None or _enum_ok(value, other)
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    check = checks.get(kind)
    return check(value) if check else True


class _Function:
    def __init__(self, fn: dict[str, Any]) -> None:
        self.fn = fn
        self.params: dict[str, Any] = fn.get("parameters") or {}
        self.defs: dict[str, Any] = self.params.get("$defs") or {}
        self.self_ref = False

    def render(self) -> str:
        params = self.type(self.params, "") if self.params else "{}"
        parts = []
        for name, schema in self.defs.items():
            head = _comment(schema["description"], "") + "\n" if schema.get("description") else ""
            parts.append(f"{head}interface {name} {self.type(schema, '')}")
        if self.self_ref:
            props = self.params.get("properties") or {}
            required = set(self.params.get("required") or [])
            fields = [self.field(n, s, n in required, "  ") for n, s in props.items()]
            parts.append("interface parameters " + _braces(fields, ""))
            params = "parameters"
        if self.fn.get("description"):
            parts.append(_comment(self.fn["description"], ""))
        parts.append(f"type {self.fn.get('name') or 'function'} = (_: {params}) => any;")
        return "\n".join(parts)

    def field(self, name: str, schema: Any, required: bool, indent: str) -> str:
        lines = self.notes(schema, indent)
        lines.append(f"{indent}{name}{'' if required else '?'}: {self.type(schema, indent)}")
        return "\n".join(lines)

    def notes(self, schema: Any, indent: str) -> list[str]:
        """The comment lines above a field: description, constraints, default."""
        if not isinstance(schema, dict):
            return []
        lines = []
        if schema.get("description"):
            lines.append(_comment(schema["description"], indent))
        kind = schema.get("type")
        keys = _CONSTRAINTS.get(kind, ()) if isinstance(kind, str) else ()
        found = sorted(k for k in keys if k in schema)
        if found:
            lines.append(f"{indent}// " + ", ".join(f"{k}: {schema[k]}" for k in found))
        if schema.get("default") is not None:
            lines.append(f"{indent}// Default: {_scalar(schema['default'])}")
        return lines

    def type(self, schema: Any, indent: str) -> str:
        if schema is True or schema == {}:
            return "any"
        if schema is False:
            return "null"
        if not isinstance(schema, dict):
            raise _Unsupported(f"schema {schema!r}")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "anyOf" in schema:
            return " | ".join(self.type(s, indent) for s in schema["anyOf"])
        kind = schema.get("type")
        if "enum" in schema:
            for v in schema["enum"]:
                if not _enum_ok(v, kind):
                    raise _Unsupported(f"enum value {v!r} is not of type {kind}")
            return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
        if isinstance(kind, list):
            if any(k not in _LIST_TYPES for k in kind):
                raise _Unsupported(f"type list {kind}")
            return " | ".join(_IN_LIST.get(k, str(k)) for k in kind)
        if kind == "object":
            return self.object(schema, indent)
        if kind == "array":
            return self.array(schema, indent)
        if kind in ("integer", "number"):
            return "number"
        if isinstance(kind, str):
            return kind
        raise _Unsupported(f"schema without a type: {schema!r}")

    def ref(self, ref: str) -> str:
        if ref == "#":
            self.self_ref = True
            return "parameters"
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in self.defs:
            raise _Unsupported(f"reference {ref}")
        return name

    def object(self, schema: dict[str, Any], indent: str) -> str:
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        inner = indent + "  "
        order = sorted(n for n in props if n in required) + sorted(
            n for n in props if n not in required
        )
        fields = [self.field(n, props[n], n in required, inner) for n in order]
        extra = schema.get("additionalProperties")
        if extra is True:
            fields.append(f"{inner}[k: string]: any")
        elif extra is False:
            fields.append(f"{inner}[k: string]: never")
        elif isinstance(extra, dict):
            fields.append(f"{inner}[k: string]: {self.type(extra, inner)}")
        elif extra is not None:
            raise _Unsupported(f"additionalProperties {extra!r}")
        return _braces(fields, indent)

    def array(self, schema: dict[str, Any], indent: str) -> str:
        items = schema.get("items")
        if not items:
            return "Array<any>"
        notes = self.notes(items, indent + "  ")
        if notes:
            inner = indent + "  "
            return "Array<\n" + "\n".join(notes) + f"\n{inner}{self.type(items, inner)}\n{indent}>"
        return f"Array<{self.type(items, indent)}>"


def _braces(fields: list[str], indent: str) -> str:
    return "{\n" + ",\n".join(fields) + f"\n{indent}}}" if fields else "{}"
