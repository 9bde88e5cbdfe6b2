"""docs/design.md held to the code: its state.db table names what each migration adds, and
every code name and path it puts in backticks exists. (Its Rooms table is held to the imports
by tests/test_layers.py.)"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sqlite3
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from regen.state.db import Store
from regen.state.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "regen"
DESIGN = ROOT / "docs" / "design.md"

OUTSIDE = {
    "datasets.load_dataset": "Hugging Face datasets' loader",
    "gc.freeze": "the standard library's",
    "stream_options.include_usage": "a field of the chat-completions request",
    "export/": "the folder a job writes its exports to",
    "NaN": "a float's not-a-number",
    "availability.retry_after": "a field of OpenRouter's error body",
}
"""Names in backticks that are not regen's, with what they are instead."""


def _section(title: str, text: str | None = None) -> str:
    text = DESIGN.read_text() if text is None else text
    return text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def _table_rows(section: str) -> dict[str, str]:
    """A markdown table's rows by the name in backticks in their first cell."""
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _columns(db: sqlite3.Connection) -> dict[str, list[str]]:
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in tables}


def migration_adds() -> Iterator[tuple[str, str, list[str], bool]]:
    """(migration, table, columns, whether it made the table) for what each migration adds,
    read by applying them one by one to an empty database."""
    db = sqlite3.connect(":memory:")
    before: dict[str, list[str]] = {}
    for migration in MIGRATIONS:
        migration(db)
        after = _columns(db)
        for table, cols in after.items():
            new = [c for c in cols if c not in before.get(table, [])]
            if new:
                yield migration.__name__[:4], table, new, table not in before
        before = after


def stale_schema_lines(text: str) -> list[str]:
    """What the state.db section misses of the migrations, a line each."""
    section = _section("state.db", text)
    rows = _table_rows(section)
    last = MIGRATIONS[-1].__name__[:4]
    out = [] if f"to {last})" in section.splitlines()[0] else [f"heading: not up to {last}"]
    for m in MIGRATIONS:
        if m.__name__[:4] not in section:
            out.append(f"{m.__name__}: not named")
    for number, table, cols, made in migration_adds():
        row = rows.get(table)
        if row is None:
            out.append(f"{number}: table `{table}` has no row")
            continue
        if number == "m001":
            continue
        if f"since {number}" not in row:
            out.append(f"{number}: the `{table}` row does not say `since {number}`")
        if not made:
            out += [f"{number}: `{table}.{c}` not named" for c in cols if f"`{c}`" not in row]
    return out


def test_the_state_db_section_names_every_migration_and_what_it_adds() -> None:
    assert stale_schema_lines(DESIGN.read_text()) == []


def test_a_stale_schema_section_is_caught() -> None:
    text = DESIGN.read_text()
    stale = text.replace("; since m014: `end_kind`", "; `end_kind`").replace(
        "m001 to m018", "m001 to m014"
    )
    stale = stale.replace("| `outages` |", "| `former_outages` |")
    assert stale_schema_lines(stale) == [
        "heading: not up to m018",
        "m012: table `outages` has no row",
        "m014: the `runs` row does not say `since m014`",
    ]
    missing_col = text.replace("`prompt_token_ids` and ", "")
    assert stale_schema_lines(missing_col) == ["m005: `results.prompt_token_ids` not named"]


def _module_of(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _top_level_names() -> dict[str, str]:
    """Each name a module of regen defines at its top (class, function, constant): its module."""
    names: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.setdefault(node.name, _module_of(path))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.setdefault(target.id, _module_of(path))
    return names


def _resolve_in(obj: Any, attrs: list[str]) -> bool:
    """Whether `obj.a.b...` exists: attributes, pydantic and dataclass fields, and attributes a
    class sets in its methods (`self.x = ...`)."""
    for i, attr in enumerate(attrs):
        fields = {**getattr(obj, "model_fields", {}), **getattr(obj, "__dataclass_fields__", {})}
        last = i == len(attrs) - 1
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif attr in fields or (
            inspect.isclass(obj) and f"self.{attr} =" in inspect.getsource(obj)
        ):
            return last
        else:
            return False
    return True


def _resolve_dotted(dotted: str) -> bool:
    """The longest importable module of `dotted`, and the rest as its attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _resolve_in(module, parts[cut:])
    return False


def code_name_exists(name: str, store: Store, tables: dict[str, list[str]]) -> bool:
    """Whether a dotted name in the document names something: `store.x` on a Store,
    `table.column` in state.db, a module of regen (or of the tests) from any of regen's
    packages and its attributes, or a name some module of regen defines and its attributes."""
    parts = re.sub(r"\(.*\)$", "", name).split(".")
    if parts[0] == "store":
        return _resolve_in(store, parts[1:])
    if len(parts) == 2 and parts[1] in tables.get(parts[0], []):
        return True
    packages = sorted({_module_of(p) for p in SRC.rglob("__init__.py")})
    if any(_resolve_dotted(f"{p}.{'.'.join(parts)}") for p in ["", *packages] if p):
        return True
    if _resolve_dotted(".".join(parts)):
        return True
    module = _top_level_names().get(parts[0])
    return module is not None and _resolve_dotted(".".join([module, *parts]))


def path_exists(token: str) -> bool:
    """A path in the document: from the repository's root, from src/regen, or a file or
    folder of src/regen by its name alone."""
    bare = token.rstrip("/")
    if (ROOT / bare).exists() or (SRC / bare).exists():
        return True
    return "/" not in bare and any(p.name == bare for p in SRC.rglob(bare))


CODE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\([^)]*\))?")
CLASS = re.compile(r"[A-Z][a-z]+[A-Z]\w*")
PATH = re.compile(r"\.?[\w.-]+(/[\w.-]+)*/?")


def stale_names(text: str) -> list[str]:
    """The names in backticks that name nothing of regen's."""
    tokens = sorted(set(re.findall(r"`([^`\n]+)`", text)))
    out = []
    with _store() as (store, tables):
        for token in tokens:
            if token in OUTSIDE:
                continue
            is_path = "/" in token or token.endswith(".py")
            if is_path and PATH.fullmatch(token):
                ok = path_exists(token)
            elif not is_path and CODE.fullmatch(token) and not _a_file_name(token):
                ok = code_name_exists(token, store, tables)
            elif CLASS.fullmatch(token):
                ok = token in _top_level_names()
            else:
                continue
            if not ok:
                out.append(token)
    return out


def _a_file_name(token: str) -> bool:
    """state.db, run.log, report.html: files a job writes, not code."""
    return token.rsplit(".", 1)[-1] in ("db", "log", "html", "lock", "toml", "md", "json")


class _store:
    """A Store on an empty state.db in a temporary folder, and its tables' columns."""

    def __enter__(self) -> tuple[Store, dict[str, list[str]]]:
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.store = Store.open(Path(self._dir.name))
        return self.store, _columns(sqlite3.connect(Path(self._dir.name) / "state.db"))

    def __exit__(self, *exc: object) -> None:
        self.store.close()
        self._dir.cleanup()


def test_every_name_in_backticks_exists() -> None:
    assert stale_names(DESIGN.read_text()) == []


@pytest.mark.parametrize(
    "name",
    [
        "`store.no_such_owner`",
        "`Store.no_such_method`",
        "`state.work.no_such_function`",
        "`items.no_such_column`",
        "`engine/no_such_module.py`",
        "`no_such_module.py`",
    ],
)
def test_a_stale_name_is_caught(name: str) -> None:
    assert stale_names(f"the map names {name} and `store.runs`, `state.db`.") == [name.strip("`")]


def test_every_room_of_the_rooms_table_exists() -> None:
    """A room renamed or removed leaves no row behind (a room missing from the table fails
    tests/test_layers.py)."""
    section = _section("Rooms")
    first_cells = [
        name
        for line in section.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([^`]+)`", line.split("|")[1])
    ]
    assert len(first_cells) > 10
    assert [r for r in first_cells if not (SRC / r).exists()] == []
