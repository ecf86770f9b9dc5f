"""float32 int8/int4 matmuls for x86 CPUs with AVX2 + FMA: cpu_matmul.cpp, built at first use.

torch's own CPU kernels for these formats are vectorised for bf16/fp16 only
(in float32 they are 10-100x slower than a float32 matmul), and bf16 matmuls
are unusable on an AVX2 CPU, which therefore serves in float32. Up to
MAX_KERNEL_ROWS rows (decode steps) cpu_matmul.cpp dequantizes each weight
row in registers and reads the weight once, at 1 or 0.5 bytes a weight
instead of float32's 4; above that (wide batches, prefill chunks), it
dequantizes a tile of output rows at a time into a float32 buffer that stays
in L2, for torch's float32 matmul, which then wins.

The library is compiled once per machine into the maas cache (a few seconds
with the system's C++ compiler) and loaded with ctypes: it needs no torch
headers, only data pointers. Without a compiler, or on another CPU, library()
is None and the layers keep dequantize + matmul.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import torch

from kernels import ops
from services.common.logging import get_logger
from services.common.model_cache import cache_root, publish

log = get_logger(__name__)

SOURCE = Path(__file__).with_name("cpu_matmul.cpp")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
# A decode step's matmuls of SmolLM2-135M (AVX2 EPYC, one thread; quant_kernel_bench):
# up to 32 rows the kernel wins; from 48 rows, dequantizing TILE_BYTES of float32
# weight at a time for torch's matmul (1.1-1.4x the kernel at 48-128 rows, 1.2-1.7x
# dequantizing the whole weight at 33-256).
MAX_KERNEL_ROWS = 32
TILE_BYTES = 256 * 1024  # half the EPYC's L2 per core
# The kernel reads whole 8-wide vectors along K and int4 groups 32 weights at a time.
_K_MULTIPLE = 8

_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES = {
    "int8_matmul_f32": [_P, _I, _I, _P, _P, _I, _I, _P, ctypes.c_int],
    "int4_matmul_f32": [_P, _I, _I, _P, _P, _P, _I, _I, _I, _P, ctypes.c_int],
    "int8_dequantize_f32": [_P, _P, _I, _I, _P, ctypes.c_int],
    "int4_dequantize_f32": [_P, _P, _P, _I, _I, _I, _P, ctypes.c_int],
}


def _cpu_supported() -> bool:
    # torch reports the widest vector ISA it dispatches to on this CPU; both imply AVX2 + FMA.
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _build(target: Path, compiler: str) -> None:
    done = subprocess.run(
        [compiler, *FLAGS, "-o", str(target), str(SOURCE)], capture_output=True, text=True
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
        log.warning("quant_cpu_kernel_unavailable", reason="no C++ compiler")
        return None
    identity = SOURCE.read_bytes() + " ".join(FLAGS).encode()
    folder = cache_root() / "cpu_kernels"
    name = f"cpu_matmul-{hashlib.sha256(identity).hexdigest()[:16]}.so"
    if not (folder / name).is_file() and not publish(
        folder, name, lambda path: _build(path, compiler)
    ):
        log.warning("quant_cpu_kernel_unavailable", reason="build failed or cache unwritable")
        return None
    try:
        lib = ctypes.CDLL(str(folder / name))
    except OSError as error:
        log.warning("quant_cpu_kernel_unavailable", reason=str(error))
        return None
    for function, argtypes in _SIGNATURES.items():
        getattr(lib, function).argtypes = argtypes
    return lib


def handles(rows: torch.Tensor, in_features: int) -> bool:
    """Whether these kernels run `rows` (float32 on this CPU) against a quantized weight."""
    # kernels.ops.force_triton() sends CPU tensors to the Triton kernels (the interpreter
    # tests the CUDA wiring on a CPU): then they must get them.
    return (
        rows.device.type == "cpu"
        and not ops._force_triton
        and rows.dtype == torch.float32
        and in_features % _K_MULTIPLE == 0
        and library() is not None
    )


def int8_matmul(rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows float32 [M, K] @ (q int8 [N, K] * scale float32 [N])^T -> [M, N]."""
    lib = library()
    k = q.shape[1]

    def weight(first: int) -> tuple:
        return q.data_ptr() + first * k, scale.data_ptr() + first * scale.element_size()

    return _matmul(rows, *q.shape, weight, lib.int8_matmul_f32, lib.int8_dequantize_f32)


def int4_matmul(
    rows: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """rows float32 [M, K] @ the int4 weight^T (quant_int4_ref.py's format, float32 scales)."""
    lib = library()
    n, k = packed.shape[0], packed.shape[1] * 2
    group_bytes = scales.shape[1] * scales.element_size()

    def weight(first: int) -> tuple:
        offset = first * group_bytes
        return (
            packed.data_ptr() + first * packed.shape[1],
            scales.data_ptr() + offset,
            mins.data_ptr() + offset,
            group_size,
        )

    return _matmul(rows, n, k, weight, lib.int4_matmul_f32, lib.int4_dequantize_f32)


def _matmul(rows: torch.Tensor, n: int, k: int, weight, matmul, dequantize) -> torch.Tensor:
    """The kernel for few rows; for more, dequantized tiles of the weight and torch's matmul.

    weight(first) is the library's weight arguments from output row `first` on.
    """
    threads = torch.get_num_threads()
    if rows.shape[0] <= MAX_KERNEL_ROWS:
        rows = rows.contiguous()
        out = torch.empty(rows.shape[0], n)
        matmul(
            rows.data_ptr(),
            rows.shape[0],
            rows.stride(0),
            *weight(0),
            n,
            k,
            out.data_ptr(),
            threads,
        )
        return out
    # One buffer that stays in L2 instead of the whole float32 weight, written to DRAM
    # and read back at every call. Each tile's products are a contiguous block of out^T.
    tile_rows = max(8, TILE_BYTES // (4 * k))
    tile = torch.empty(tile_rows, k)
    out_t = torch.empty(n, rows.shape[0])
    for first in range(0, n, tile_rows):
        count = min(tile_rows, n - first)
        dequantize(*weight(first), count, k, tile.data_ptr(), threads)
        torch.mm(tile[:count], rows.T, out=out_t[first : first + count])
    return out_t.T.contiguous()
