"""The sizes of the house: lines per room (folder), the largest classes and functions, and what
each room imports from the others (a room should import only the rooms below it).

    .venv/bin/python scripts/rooms.py [--src src/regen] [--top 12]
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter, defaultdict
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="src/regen")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    root = Path(args.src)
    rooms: Counter[str] = Counter()
    sizes: list[tuple[int, str]] = []
    imports: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        text = path.read_text()
        rooms[room] += len(text.splitlines())
        for target in re.findall(r"^\s*from regen\.(\w+)", text, re.M):
            if target != room:
                imports[room].add(target)
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                sizes.append((node.end_lineno - node.lineno + 1, f"{kind} {rel}:{node.name}"))
    print(f"lines: {sum(rooms.values())} in {len(list(root.rglob('*.py')))} files")
    for room, n in rooms.most_common():
        uses = ", ".join(sorted(imports.get(room, ())))
        print(f"  {room:14} {n:6}  imports: {uses or '-'}")
    print(f"largest classes and functions (top {args.top}):")
    for n, name in sorted(sizes, reverse=True)[: args.top]:
        print(f"  {n:5}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
