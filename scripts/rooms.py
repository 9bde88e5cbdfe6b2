"""The house's layer rule, checked: each room (a folder or a top-level module of src/regen) may
import only the rooms below it in docs/design.md's Rooms table, plus the few crossings
CROSSINGS lists with their reasons; only the views draw on a terminal (rich), and the command
makes the console they draw on. Also the sizes of the house: lines per room and the largest
classes and functions.

    .venv/bin/python scripts/rooms.py [--src src/regen] [--design docs/design.md] [--top 12]

Exits 1, naming each import that breaks the rule; tests/test_layers.py runs the same check.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CROSSINGS: dict[tuple[str, str], str] = {
    ("sim.chat", "reconstruct.kimi_ts"): (
        "the simulator renders Kimi-K2.5's tool declarations with regen's code, which is checked "
        "against a golden file made by Moonshot's own code (tests/reconstruct/"
        "kimi_ts_golden.json), so neither side is the other's only oracle"
    ),
}
"""The imports allowed across the rule, (importer, imported) as modules under `regen.`, each
with why: the only place they are listed."""


DRAWING = ("view/", "outputs/report/")
"""Where the terminal's library (rich) may be imported: the views. The pipeline's stages say
what happens as events (`regen/events.py`), which the views show."""

CONSOLE_ONLY = {"cli.py": "rich.console"}
"""Where only rich's console may be imported: the command makes the console and hands it to
the listeners and views; it draws no table itself."""


@dataclass(frozen=True)
class Import:
    """One import of regen's code: where it is, and the modules on both sides."""

    path: Path
    line: int
    importer: str
    imported: str


def room_rows(design: Path) -> list[list[str]]:
    """The rooms of docs/design.md's Rooms table, a row each, top first: the names in
    backticks in each row's first cell (`run/` for a folder, `cli.py` for a module)."""
    text = design.read_text()
    section = text.split("\n## Rooms\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or set(cells[1].strip()) <= set("-") or cells[1].strip() == "room":
            continue
        rows.append(re.findall(r"`([^`]+)`", cells[1]))
    return rows


def room_of(src: Path, module: str) -> str:
    """The room a module (dotted, under `regen.`; "" for the package) lives in."""
    head = module.split(".")[0]
    if head and (src / head).is_dir():
        return f"{head}/"
    if head and (src / f"{head}.py").is_file():
        return f"{head}.py"
    return "__init__.py"  # the package itself, or a name it defines such as __version__


def _is_module(src: Path, dotted: str) -> bool:
    path = src.joinpath(*dotted.split(".")) if dotted else src
    return path.is_dir() or path.with_suffix(".py").is_file()


def _module_name(src: Path, path: Path) -> tuple[str, str]:
    """(the module's dotted name under `regen.`, the package its relative imports start from)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _targets(src: Path, node: ast.Import | ast.ImportFrom, package: str) -> Iterator[str]:
    """The regen modules an import statement names (dotted, under `regen.`)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == "regen" or alias.name.startswith("regen."):
                yield alias.name.removeprefix("regen").removeprefix(".")
        return
    if node.level:
        base = package.split(".") if package else []
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, *(node.module.split(".") if node.module else [])])
    elif node.module == "regen" or (node.module or "").startswith("regen."):
        module = (node.module or "").removeprefix("regen").removeprefix(".")
    else:
        return
    for alias in node.names:
        sub = f"{module}.{alias.name}" if module else alias.name
        yield sub if _is_module(src, sub) else module


def imports(src: Path) -> Iterator[Import]:
    """Every import of regen's code under `src`: at the top, inside functions, under
    TYPE_CHECKING, absolute or relative."""
    for path in sorted(src.rglob("*.py")):
        importer, package = _module_name(src, path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(src, node, package):
                    yield Import(path, node.lineno, importer, target)


def broken(
    src: Path, rows: list[list[str]], crossings: dict[tuple[str, str], str] = CROSSINGS
) -> list[str]:
    """Each import that breaks the rule (a room above, or another room of its own row), and
    each room of `src` the table does not place, as one line naming it."""
    rank = {room: i for i, row in enumerate(rows) for room in row}
    found = {room_of(src, _module_name(src, p)[0]) for p in src.rglob("*.py")}
    out = [f"{room}: not in docs/design.md's Rooms table" for room in sorted(found - rank.keys())]
    for imp in dict.fromkeys(imports(src)):  # a statement naming two things of one module
        a, b = room_of(src, imp.importer), room_of(src, imp.imported)
        if a == b or a not in rank or b not in rank or rank[a] < rank[b]:
            continue
        if (imp.importer, imp.imported) in crossings:
            continue
        where = imp.path.relative_to(src.parent)
        out.append(
            f"{where}:{imp.line}: {a} imports {b} (regen.{imp.imported}), "
            f"which is {'in its own row' if rank[a] == rank[b] else 'above it'}"
        )
    return out


def terminal_imports(src: Path, drawing: tuple[str, ...] = DRAWING) -> list[str]:
    """Each import of rich outside the rooms that draw, as one line naming it."""
    out = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(drawing):
            continue
        allowed = CONSOLE_ONLY.get(rel)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                if (name == "rich" or name.startswith("rich.")) and name != allowed:
                    out.append(
                        f"{path.relative_to(src.parent)}:{node.lineno}: imports {name}: say it "
                        "as an event (regen/events.py) and draw it in view/"
                    )
    return out


def sizes(src: Path, top: int) -> None:
    """Print the lines per room, what each imports from the others, the largest definitions."""
    lines: Counter[str] = Counter()
    uses: dict[str, set[str]] = defaultdict(set)
    defs: list[tuple[int, str]] = []
    for imp in imports(src):
        a, b = room_of(src, imp.importer), room_of(src, imp.imported)
        if a != b:
            uses[a].add(b)
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        lines[room_of(src, _module_name(src, path)[0])] += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                name = f"{kind} {path.relative_to(src)}:{node.name}"
                defs.append((node.end_lineno - node.lineno + 1, name))
    print(f"lines: {sum(lines.values())} in {len(list(src.rglob('*.py')))} files")
    for room, n in lines.most_common():
        print(f"  {room:16} {n:6}  imports: {', '.join(sorted(uses[room])) or '-'}")
    print(f"largest classes and functions (top {top}):")
    for n, name in sorted(defs, reverse=True)[:top]:
        print(f"  {n:5}  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src" / "regen")
    ap.add_argument("--design", type=Path, default=ROOT / "docs" / "design.md")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    sizes(args.src, args.top)
    problems = broken(args.src, room_rows(args.design)) + terminal_imports(args.src)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
