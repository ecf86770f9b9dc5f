"""What this machine has to compute with: the CPU as `lscpu` shows it, its cores, a GPU.

Read from /proc and /sys, without torch, so processes that only launch
others (`maas up`, the peer venv builder, a benchmark's report) can choose
dtypes, threads and build flags without loading it. Everything that asks
what the machine can do reads it here; the engine's per-machine defaults
(services/engine/machine_defaults.py) are derived from it.
"""

import functools
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

# Native bfloat16 matmuls; without them bf16 is emulated and far slower than float32.
BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "amx_int8"})


@dataclass(frozen=True)
class MachineProfile:
    cpu_model: str
    flags: frozenset[str]
    # CPUs this process may run on (its affinity), and the physical cores among them.
    cpus: int
    physical_cores: int
    # A cgroup CPU limit (a pod's `resources.limits.cpu`) in CPUs; None when unlimited.
    cpu_quota: float | None = None
    # The first NVIDIA GPU's model name as the driver reports it; empty without one.
    gpu: str = ""

    @property
    def native_bf16(self) -> bool:
        return bool(BF16_FLAGS & self.flags)

    @property
    def amx(self) -> bool:
        return bool(AMX_FLAGS & self.flags)

    @property
    def simd_flags(self) -> list[str]:
        """The flags that decide a CPU's matmul speed (bf16 and int8 paths above all)."""
        return sorted(f for f in self.flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))

    @property
    def compute_cores(self) -> int:
        """Cores one compute thread each can keep busy: physical cores, within the cgroup limit.

        SMT siblings share a core's FMA units, so a second thread per core adds
        no matmul throughput and makes every OpenMP barrier wait for the slower
        sibling; a CPU limit below the cores throttles threads past it.
        """
        cores = self.physical_cores
        if self.cpu_quota is not None:
            cores = min(cores, max(1, math.floor(self.cpu_quota)))
        return max(1, cores)


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks = []
    for chunk in text.split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def parse_cpuinfo(text: str, affinity: set[int]) -> tuple[str, frozenset[str], int]:
    """Model name, flags and physical cores within `affinity`, from /proc/cpuinfo's text."""
    blocks = _cpuinfo_blocks(text)
    first = blocks[0] if blocks else {}
    cores = {
        (block.get("physical id", "0"), block["core id"])
        for block in blocks
        if "core id" in block and int(block.get("processor", -1)) in affinity
    }
    return (
        first.get("model name") or platform.processor() or platform.machine(),
        frozenset(first.get("flags", "").split()),
        len(cores) or len(affinity),
    )


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2's cpu.max ("200000 100000" = 2 CPUs; "max 100000" = unlimited)."""
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _cpu_quota() -> float | None:
    try:
        return parse_cpu_max(Path("/sys/fs/cgroup/cpu.max").read_text())
    except (OSError, ValueError):
        return None


def _gpu_model() -> str:
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.partition(":")[2].strip()
        except OSError:
            continue
    return ""


@functools.cache
def machine_profile() -> MachineProfile:
    affinity = os.sched_getaffinity(0)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    model, flags, physical = parse_cpuinfo(cpuinfo, affinity)
    return MachineProfile(
        cpu_model=model,
        flags=flags,
        cpus=len(affinity),
        physical_cores=physical,
        cpu_quota=_cpu_quota(),
        gpu=_gpu_model(),
    )
