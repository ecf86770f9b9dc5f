"""The engine's C++ kernels for x86 CPUs with AVX2 + FMA: one library, built at first use.

Every `.cpp` in this folder is compiled together into one shared object, once
per machine, into the maas cache (a few seconds with the system's C++
compiler), and loaded with ctypes: the kernels need no torch headers, only
data pointers. Each module that calls the library declares its functions'
argument types (`bind`). OpenMP is torch's: the library links `libgomp.so.1`,
which resolves to the copy torch already loaded, and the callers pass
torch.get_num_threads(). Without a compiler, or on a CPU without AVX2,
library() is None and the callers keep their torch paths.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import torch

from services.common.logging import get_logger
from services.common.model_cache import cache_root, publish

log = get_logger(__name__)

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
# The headers they include are part of the build: a changed one must not reuse a cached .so.
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")

# ctypes argument types the kernels' signatures are written in.
POINTER = ctypes.c_void_p
INT = ctypes.c_int64
THREADS = ctypes.c_int


def _cpu_supported() -> bool:
    # torch reports the widest vector ISA it dispatches to on this CPU; both imply AVX2 + FMA.
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _build(target: Path, compiler: str) -> None:
    done = subprocess.run(
        [compiler, *FLAGS, "-o", str(target), *map(str, SOURCES)], capture_output=True, text=True
    )
    if done.returncode:
        # An OSError, so that publish removes the partial file and reports it.
        raise OSError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot run (not AVX2, no compiler)."""
    if not _cpu_supported():
        return None
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        log.warning("cpu_native_kernels_unavailable", reason="no C++ compiler")
        return None
    identity = b"".join(f.read_bytes() for f in SOURCES + HEADERS) + " ".join(FLAGS).encode()
    folder = cache_root() / "cpu_kernels"
    name = f"engine-{hashlib.sha256(identity).hexdigest()[:16]}.so"
    if not (folder / name).is_file() and not publish(
        folder, name, lambda path: _build(path, compiler)
    ):
        log.warning("cpu_native_kernels_unavailable", reason="build failed or cache unwritable")
        return None
    try:
        return ctypes.CDLL(str(folder / name))
    except OSError as error:
        log.warning("cpu_native_kernels_unavailable", reason=str(error))
        return None


def bind(signatures: dict[str, list]) -> ctypes.CDLL | None:
    """library() with these functions' argument types set (idempotent), or None."""
    lib = library()
    if lib is not None:
        for function, argtypes in signatures.items():
            getattr(lib, function).argtypes = argtypes
    return lib
