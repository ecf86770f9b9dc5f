"""`helm template` of the chart, for tests that read what it renders."""

import shutil
import subprocess
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "maas"


def helm_binary() -> str:
    path = ROOT / ".venv" / "bin" / "helm"
    found = str(path) if path.exists() else shutil.which("helm")
    assert found, "no helm binary: run `make install-helm`"
    return found


@cache
def rendered(namespace: str, *settings: str) -> tuple[dict, ...]:
    """The chart's objects installed into namespace with these --set values."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    result = subprocess.run(
        [helm_binary(), "template", "maas", str(CHART), "-n", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
