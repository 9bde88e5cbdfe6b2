"""The layer rule under test: every import in src/regen goes down docs/design.md's Rooms table,
or is one of the crossings scripts/rooms.py lists with its reason."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "regen"
DESIGN = ROOT / "docs" / "design.md"


def _load_rooms() -> ModuleType:
    """scripts/rooms.py, the one checker (the command line runs it too)."""
    spec = importlib.util.spec_from_file_location("rooms", ROOT / "scripts" / "rooms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rooms"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rooms = _load_rooms()


def test_every_import_goes_down_the_rooms_table() -> None:
    assert rooms.broken(SRC, rooms.room_rows(DESIGN)) == []


def test_the_table_is_read_in_order_with_every_room() -> None:
    rows = rooms.room_rows(DESIGN)
    flat = [room for row in rows for room in row]
    assert flat[:3] == ["__main__.py", "cli.py", "run/"]
    assert flat.index("config.py") < flat.index("state/") < flat.index("safe.py")
    assert len(flat) == len(set(flat))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A fake src/regen in tmp: each module with its text."""
    src = tmp_path / "regen"
    for name, text in {"__init__.py": "", **files}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


@pytest.mark.parametrize(
    "statement",
    [
        "from regen.config import Job",
        "import regen.config",
        "from regen import config",
        "from .. import config",
        "from ..config import Job",
        "def later():\n    from regen.config import Job\n    return Job",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from regen.config import Job",
    ],
)
def test_an_import_from_state_to_the_job_file_breaks_the_rule(
    tmp_path: Path, statement: str
) -> None:
    files = {"config.py": "Job = 1\n", "state/__init__.py": "", "state/db.py": "", "safe.py": ""}
    files["state/work.py"] = "from regen.safe import x\nfrom . import db\n" + statement + "\n"
    src = _tree(tmp_path, files)
    problems = rooms.broken(src, rooms.room_rows(DESIGN))
    assert len(problems) == 1
    assert "regen/state/work.py:" in problems[0]
    assert "state/ imports config.py (regen.config), which is above it" in problems[0]


def test_an_import_within_a_row_or_of_an_unplaced_room_breaks_the_rule(tmp_path: Path) -> None:
    files = {"failpoints.py": "", "newroom.py": ""}
    files["errors.py"] = "import json\nfrom regen.failpoints import reached\n"
    src = _tree(tmp_path, files)
    assert rooms.broken(src, rooms.room_rows(DESIGN)) == [
        "newroom.py: not in docs/design.md's Rooms table",
        "regen/errors.py:2: errors.py imports failpoints.py (regen.failpoints), which is in its "
        "own row",
    ]


def test_each_crossing_allowed_is_still_made_and_says_why() -> None:
    made = {(i.importer, i.imported) for i in rooms.imports(SRC)}
    for (importer, imported), reason in rooms.CROSSINGS.items():
        assert (importer, imported) in made, f"{importer} -> {imported} is listed but not made"
        assert len(reason) > 40


def test_only_the_command_and_the_views_draw_on_a_terminal() -> None:
    assert rooms.terminal_imports(SRC) == []


@pytest.mark.parametrize(
    "statement", ["from rich.console import Console", "import rich", "import rich.table as t"]
)
def test_a_stage_that_draws_on_a_terminal_breaks_the_rule(tmp_path: Path, statement: str) -> None:
    files = {"run/__init__.py": "", "run/stage.py": f"import logging\n{statement}\n"}
    files["view/show.py"] = "from rich.console import Console\n"
    files["outputs/report/page.py"] = "from rich.text import Text\n"
    files["cli.py"] = "from rich.console import Console\n"
    src = _tree(tmp_path, files)
    assert rooms.terminal_imports(src) == [
        f"regen/run/stage.py:2: imports {statement.split()[1]}: say it as an event "
        "(regen/events.py) and draw it in view/"
    ]


def test_the_command_line_makes_the_console_and_draws_nothing(tmp_path: Path) -> None:
    files = {"cli.py": "from rich.console import Console\nfrom rich.table import Table\n"}
    src = _tree(tmp_path, files)
    assert rooms.terminal_imports(src) == [
        "regen/cli.py:2: imports rich.table: say it as an event (regen/events.py) and draw it "
        "in view/"
    ]


SCHEMA_NUMBERS = ("schema_version", "stored_version")


def test_only_state_knows_its_schema_numbers() -> None:
    """Readers ask `Store.records(...)` what an old state.db holds; the version numbers stay
    in state/."""
    calls = []
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(SRC / "state"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SCHEMA_NUMBERS:
                calls.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert calls == []


def test_the_script_checks_and_prints_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    old = sys.argv
    sys.argv = ["rooms.py", "--top", "2"]
    try:
        assert rooms.main() == 0
    finally:
        sys.argv = old
    out = capsys.readouterr().out
    assert "state/" in out and "largest classes and functions (top 2):" in out


def dialect_name_tests(src: Path) -> list[str]:
    """Comparisons of an endpoint's dialect with a kind's name (`e.dialect == "vllm"`,
    `dialect in (...)`), outside config.py, which keeps what each kind does (DIALECTS), and
    sim/, which keeps its own words for the servers it stands in for."""
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel.parts[0] == "sim" or rel == Path("config.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            names = [n for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)]
            said = any(
                (n.attr if isinstance(n, ast.Attribute) else n.id) in ("dialect", "SELF_HOSTED")
                for n in names
            )
            kinds = any(
                isinstance(n, ast.Constant)
                and n.value in ("openrouter", "openai", "vllm", "sglang")
                for n in ast.walk(node)
            )
            if said and (kinds or "SELF_HOSTED" in ast.unparse(node)):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_code_asks_the_dialect_record_not_the_dialects_name() -> None:
    assert dialect_name_tests(SRC) == []


def test_a_dialect_name_test_is_caught(tmp_path: Path) -> None:
    src = _tree(tmp_path, {"run/x.py": 'def f(e):\n    return e.dialect == "vllm"\n'})
    assert dialect_name_tests(src) == ["run/x.py:2: e.dialect == 'vllm'"]


def private_imports(src: Path) -> list[str]:
    """`from regen.x import _name` anywhere under `src`: a module leaning on another's insides
    (each place as `file:line name`)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("regen"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(src)}:{node.lineno} {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names(tmp_path: Path) -> None:
    assert private_imports(SRC) == []
    (tmp_path / "a.py").write_text("from regen.outputs.report.markup import _esc\n")
    assert private_imports(tmp_path) == ["a.py:1 _esc"]


LONGEST_FUNCTION = 58
"""Lines of a function or method outside sim/, its signature and docstring included: half of
the longest there was (117) when issue 49 set the rule."""
LARGEST_CLASS = 370
"""Lines of a class outside sim/: half of the largest there was (Scheduler, 740)."""


def oversized(src: Path) -> list[str]:
    """Every function longer than LONGEST_FUNCTION and class larger than LARGEST_CLASS lines
    under `src`, the simulator (a stand-in, not regen) left out."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if "sim" in path.relative_to(src).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            bound = (
                LARGEST_CLASS
                if isinstance(node, ast.ClassDef)
                else LONGEST_FUNCTION
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                else None
            )
            if bound is not None and (lines := node.end_lineno - node.lineno + 1) > bound:
                found.append(f"{path.relative_to(src)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_or_class_outside_the_simulator_outgrows_its_bound(tmp_path: Path) -> None:
    assert oversized(SRC) == []
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    (tmp_path / "long.py").write_text(f"def f():\n{body}")
    assert oversized(tmp_path) == [f"long.py:1 f ({LONGEST_FUNCTION + 1} lines)"]
