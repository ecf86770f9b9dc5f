"""Raise every `>=` floor in pyproject.toml to the version constraints.txt pins.

Floors are a promise that the project works with that version, and only the
pinned versions are tested (every install takes constraints.txt), so a floor
below its pin is a promise nobody checks. `make lock` runs this after it
re-resolves constraints.txt; tests/unit/test_dependency_floors.py fails when a
floor and its pin part. `==` pins and requirements with no version are kept.

Usage: python deploy/lock_floors.py [--check]
"""

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# A quoted requirement string in pyproject's dependency arrays.
QUOTED = re.compile(r'^(\s*")([^"]+)(",?.*)$')


def pins(constraints: str) -> dict[str, str]:
    found = {}
    for line in constraints.splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def raised(line: str, pinned: dict[str, str]) -> str:
    match = QUOTED.match(line)
    if not match:
        return line
    try:
        requirement = Requirement(match[2])
    except ValueError:
        return line  # a quoted string that is not a requirement
    floors = [s for s in requirement.specifier if s.operator == ">="]
    version = pinned.get(canonicalize_name(requirement.name))
    if len(floors) != 1 or version is None or floors[0].version == version:
        return line
    text = match[2].replace(f">={floors[0].version}", f">={version}", 1)
    return f"{match[1]}{text}{match[3]}"


def main() -> int:
    pyproject = ROOT / "pyproject.toml"
    pinned = pins((ROOT / "constraints.txt").read_text())
    before = pyproject.read_text()
    after = "\n".join(raised(line, pinned) for line in before.split("\n"))
    if "--check" in sys.argv:
        stale = [b for b, a in zip(before.split("\n"), after.split("\n"), strict=True) if a != b]
        for line in stale:
            print(f"floor below its pin: {line.strip()}", file=sys.stderr)
        return 1 if stale else 0
    pyproject.write_text(after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
