"""The engine's serving process computes nothing, so it imports no torch: that import
cost every engine start ~2 s of CPU and ~180 MB in that process (measured, #32's
session 28). Run in a fresh interpreter: this one has torch already."""

import subprocess
import sys

import pytest

from maas_services.common.machine_profile import machine_profile

PROBE = """
import sys
from maas_services.engine.core.launcher import resolve_for_core
from maas_services.engine.server import serve
from maas_services.engine.settings import EngineSettings
resolve_for_core(EngineSettings())
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""


@pytest.mark.skipif(bool(machine_profile().gpu), reason="with a GPU, auto asks torch for CUDA")
def test_the_serving_process_resolves_its_core_without_importing_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
