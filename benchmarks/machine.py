"""What a benchmark result records of the machine it ran on."""

import os
import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The CPU a figure was measured on, as lscpu names it, and how busy the machine was."""
    from services.common.cpu_flags import cpu_flags

    flags = sorted(cpu_flags())
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        # What decides a CPU's matmul speed (bf16 and int8 paths above all), then every flag.
        "simd_flags": [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")],
        "flags": flags,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "platform": platform.platform(),
    }
