"""The engine's C++ kernels for x86 CPUs with AVX2 + FMA: one library, built at first use.

Every `.cpp` in this folder is compiled together into one shared object, once
per machine, into the maas cache (a few seconds with the system's C++
compiler), and loaded with ctypes: the kernels need no torch headers, only
data pointers. bindings.py declares every function's types and the structures'
layout, once, for every caller. OpenMP is torch's: the library links `libgomp.so.1`,
which resolves to the copy torch already loaded, and the callers pass
torch.get_num_threads(). Without a compiler, or on a CPU without AVX2,
library() is None and the callers keep their torch paths.

A CPU with AVX-512 gets a build for it (`-mavx512f`): matmul.cpp's panel
GEMM then runs its tiles in 512-bit vectors, with the same sums. One that also
has AVX512-BF16 gets the bf16 panel GEMM (bf16_panel.cpp, `-mavx512bf16`),
and one with AMX its tiles too (amx_panel.cpp, `-mamx-tile -mamx-bf16`): the
engine takes them only when asked (--wide-gemm), since they change the
arithmetic. Every other CPU runs the portable AVX2 build.

An image without a compiler (the chart's engine pods: a slim runtime stage,
a read-only root) carries the portable library prebuilt beside these sources
(`python -m maas_kernels.native.library`, run where the package is
installed; deploy/Dockerfile does it in its build stage): library() takes
this CPU's own build where one exists, then a prebuilt file whose name
matches these sources' hash, before building one.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import torch

from maas_services.common.logging import get_logger
from maas_services.common.machine_profile import machine_profile
from maas_services.common.model_cache import cache_root, publish

log = get_logger(__name__)

FOLDER = Path(__file__).parent
SOURCES = tuple(sorted(FOLDER.glob("*.cpp")))
# Where an image's prebuilt library sits: the installed package, beside the sources.
PREBUILT = FOLDER
# The headers they include are part of the build: a changed one must not reuse a cached .so.
HEADERS = tuple(sorted(FOLDER.glob("*.h")))
# The portable build's: any x86 CPU with AVX2 and FMA.
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")


def _cpu_supported() -> bool:
    # torch reports the widest vector ISA it dispatches to on this CPU; both imply AVX2 + FMA.
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


# What a CPU's /proc/cpuinfo flags add to the portable build, each only with the ones
# before it: AVX-512's tiles; bf16 dot products (vdpbf16ps, in 512- and 256-bit vectors)
# for the bf16 panel GEMM (bf16_panel.cpp); AMX's bf16 tiles for the same panels
# (amx_panel.cpp).
ISA_FLAGS = (
    (frozenset({"avx512f"}), ("-mavx512f",)),
    (frozenset({"avx512_bf16", "avx512vl"}), ("-mavx512bf16", "-mavx512vl")),
    (frozenset({"amx_tile", "amx_bf16"}), ("-mamx-tile", "-mamx-bf16")),
)


# Whatever the levels above: AVX512-VNNI's int16 dot products (vpdpwssd, in 256-bit
# vectors) for qdot.cpp's interleaved kernels, and its int8 ones (vpdpbusd, in 512-bit
# vectors, with AVX512BW's byte operations) for its wide interleaved kernel.
VNNI = (
    frozenset({"avx512f", "avx512vl", "avx512bw", "avx512_vnni"}),
    ("-mavx512vl", "-mavx512bw", "-mavx512vnni"),
)


def build_flags(cpu_flags: frozenset[str]) -> tuple[str, ...]:
    """The flags of the build for a CPU with these /proc/cpuinfo flags."""
    flags = FLAGS
    for needs, adds in ISA_FLAGS:
        if not needs <= cpu_flags:
            break
        flags = (*flags, *adds)
    needs, adds = VNNI
    return (*flags, *adds) if needs <= cpu_flags else flags


def build(
    target: Path, compiler: str, flags: tuple[str, ...] = FLAGS, sources: tuple[Path, ...] = SOURCES
) -> None:
    """Compile sources (these kernels, or another revision's: benchmarks/library_ab.py) into
    the shared object target."""
    done = subprocess.run(
        [compiler, *flags, "-o", str(target), *map(str, sources)], capture_output=True, text=True
    )
    if done.returncode:
        # An OSError, so that publish removes the partial file and reports it.
        raise OSError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")


def _name(flags: tuple[str, ...] = FLAGS) -> str:
    """The library's file name: a changed source, header or flag never reuses a build."""
    identity = b"".join(f.read_bytes() for f in SOURCES + HEADERS) + " ".join(flags).encode()
    return f"engine-{hashlib.sha256(identity).hexdigest()[:16]}.so"


def _existing(name: str, folders: tuple[Path, ...]) -> Path | None:
    return next((f / name for f in folders if (f / name).is_file()), None)


def find_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, unbound (bindings.library() binds them), or None where they
    cannot run (not AVX2, no compiler)."""
    if not _cpu_supported():
        return None
    flags = build_flags(machine_profile().flags)
    name, cached = _name(flags), cache_root() / "cpu_kernels"
    # This CPU's build, else an image's portable one (it has no compiler for this CPU's).
    path = _existing(name, (PREBUILT, cached)) or _existing(_name(), (PREBUILT,))
    if path is None:
        compiler = find_compiler()
        if compiler is None:
            log.warning("cpu_native_kernels_unavailable", reason="no C++ compiler")
            return None
        path = cached / name
        if not publish(cached, name, lambda target: build(target, compiler, flags)):
            log.warning("cpu_native_kernels_unavailable", reason="build failed or cache unwritable")
            return None
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        log.warning("cpu_native_kernels_unavailable", reason=str(error))
        return None


def prebuild() -> Path:
    """Build the portable library into PREBUILT, where library() looks before building."""
    compiler = find_compiler()
    if compiler is None:
        raise SystemExit("no C++ compiler (set CXX or install g++)")
    target = PREBUILT / _name()
    build(target, compiler)
    return target


if __name__ == "__main__":
    print(prebuild())
