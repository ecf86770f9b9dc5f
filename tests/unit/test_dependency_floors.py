"""Every floor in pyproject.toml is the version CI tests (constraints.txt's pin).

A floor below its pin promises a version no run installs; `make lock` raises
the floors with the pins (deploy/lock_floors.py).
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_floor_is_the_pinned_version():
    check = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "lock_floors.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
