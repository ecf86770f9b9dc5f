"""What the CPU can do, from /proc/cpuinfo's flags (as `lscpu` shows them).

Read without torch, so processes that only launch others (`maas up`, the peer
venv builder) can choose dtypes and build flags without loading it.
"""

import functools
from pathlib import Path

# Native bfloat16 matmuls; without them bf16 is emulated and far slower than float32.
_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def has_native_bf16() -> bool:
    return bool(_BF16_FLAGS & cpu_flags())
