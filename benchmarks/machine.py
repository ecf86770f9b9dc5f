"""What a benchmark result records of the machine it ran on."""

import os
import platform

from maas_services.common.machine_profile import machine_profile


def cpu_model() -> str:
    return machine_profile().cpu_model


def load_average_1m() -> float:
    """The 1-minute load average, as every result records it beside its figures."""
    return round(os.getloadavg()[0], 2)


def machine() -> dict:
    """The CPU a figure was measured on, as lscpu names it, and how busy the machine was."""
    profile = machine_profile()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "physical_cores": profile.physical_cores,
        "simd_flags": profile.simd_flags,
        "flags": sorted(profile.flags),
        "gpu": profile.gpu,
        "load_average_1m": load_average_1m(),
        "platform": platform.platform(),
    }
