"""pyproject.toml's lower bounds against the venv that `make test-lowest` built: each package
that the dependencies and the dev extras name must be installed at exactly its lower bound,
so that a bound the suite passed with is the bound users are promised.

    .venv-lowest/bin/python scripts/lowest_bounds.py [--pyproject pyproject.toml]

Run by the venv it checks. Exits 1, naming each package installed above its bound (another
package's own requirement lifted it: raise the bound to that version, or lower the other).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def lower_bound(req: Requirement) -> Version | None:
    """The version a `>=` (or `==`) clause names, or None for a requirement without one."""
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    return max(bounds) if bounds else None


def mismatches(pyproject: Path) -> list[str]:
    """One line per named package not installed at its lower bound."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = []
    for text in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(text)
        bound = lower_bound(req)
        if bound is None:
            continue
        try:
            have = Version(version(req.name))
        except PackageNotFoundError:
            lines.append(f"{req.name}: not installed (pyproject.toml asks {req.specifier})")
            continue
        if have != bound:
            lines.append(
                f"{req.name}: {have} installed where pyproject.toml's lower bound is {bound}; "
                "another package's requirement lifted it: raise the bound to it"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    lines = mismatches(parser.parse_args().pyproject)
    for line in lines:
        print(f"lowest_bounds: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
