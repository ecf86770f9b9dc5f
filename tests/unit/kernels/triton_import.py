"""Import a Triton kernel module, or skip where triton cannot be installed at all."""

import importlib
import platform
import sys
from types import ModuleType

import pytest

# The platforms triton publishes wheels for; the test extra installs it there.
_TRITON_PLATFORMS = {("linux", "x86_64"), ("linux", "aarch64")}


def import_kernel(name: str) -> ModuleType:
    """maas_kernels.<name>; a missing triton fails on Linux, where it is a broken install."""
    if (sys.platform, platform.machine()) in _TRITON_PLATFORMS:
        return importlib.import_module(f"maas_kernels.{name}")
    return pytest.importorskip(
        f"maas_kernels.{name}",
        reason=f"triton has no wheels for {sys.platform}/{platform.machine()}",
    )
