"""float32 int8/int4 matmuls for x86 CPUs with AVX2 + FMA: native/matmul.cpp.

torch's own CPU kernels for these formats are vectorised for bf16/fp16 only
(in float32 they are 10-100x slower than a float32 matmul), and bf16 matmuls
are unusable on an AVX2 CPU, which therefore serves in float32. Up to
MAX_ROW_KERNEL_ROWS rows (narrow decode steps) matmul.cpp dequantizes
each weight row in registers and reads the weight once, at 1 or 0.5 bytes a
weight instead of float32's 4; above that (wider decode batches, prefill
chunks: compute-bound), it runs as a GEMM of its own, in one call: panels
of PANEL_BYTES of output rows dequantized once each into a float32 buffer
that stays in L2, multiplied by every activation row with a register-blocked
micro-kernel. Both write the [M, N] output directly.

The library is the engine's native one (kernels/native/bindings.py);
where it cannot be built, library() is None and the layers keep dequantize +
matmul.
"""

import torch

from maas_kernels import ops
from maas_kernels.native import bindings

# A decode step's matmuls of SmolLM2-135M (AVX2 EPYC, one thread, thread CPU ms;
# quant_kernel_bench, "panels"): the row kernel wins up to 4 rows (int8 17 ms against
# the GEMM's 25 at 4), the GEMM from 5-8 on (21 against 23 at 8; 1.5-2x the row kernel
# and session 6's dequantized L2 tiles + torch.mm at 32-128, and ahead of float32's
# F.linear up to 256 rows, prefill included).
MAX_ROW_KERNEL_ROWS = 4
# The integer row kernels (native/qdot.cpp, int8 activations) against the panel GEMM, over
# the 30 layers' shapes at 2 threads (first-generation Zen, AMD EPYC family 23 model 1,
# avx2; ad-hoc harness, 8 alternating rounds, docs/quantization.md): int4-g32 0.62x /
# 0.73x / 0.92x / 0.95x the GEMM's time at 4 / 5 / 6 / 8 rows and 1.05x at 12, int8
# 0.69x / 0.79x / 0.83x / 0.89x and 1.07x.
MAX_INTEGER_ROW_KERNEL_ROWS = 8
# 54 float32 rows of SmolLM2's 576 inputs: a quarter of the EPYC's 512 KiB L2 per core,
# leaving room for the activations; 32-256 KiB measured within noise of each other.
PANEL_BYTES = 128 * 1024
# The kernel reads whole 8-wide vectors along K and int4 groups 32 weights at a time.
_K_MULTIPLE = 8
# The integer row kernels (native/qdot.cpp) round the activations per block of this many.
ACTIVATION_BLOCK = 32


def handles(rows: torch.Tensor, in_features: int) -> bool:
    """Whether these kernels run `rows` (float32 on this CPU) against a quantized weight."""
    # maas_kernels.ops.force_triton() sends CPU tensors to the Triton kernels (the interpreter
    # tests the CUDA wiring on a CPU): then they must get them.
    return (
        rows.device.type == "cpu"
        and not ops._force_triton
        and rows.dtype == torch.float32
        and in_features % _K_MULTIPLE == 0
        and bindings.library() is not None
    )


def int8_matmul(
    rows: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    group_size: int = 0,
    int8_activations: bool = False,
) -> torch.Tensor:
    """rows float32 [M, K] @ (q int8 [N, K] * scale float32)^T -> [M, N]; scale [N] (a
    scale per row, group_size 0) or [N, K / group_size].

    int8_activations: up to MAX_INTEGER_ROW_KERNEL_ROWS rows, the rows rounded to int8
    per block of 32 and integer dot products (native/qdot.cpp), where K allows.
    """
    lib = bindings.library()
    weight = (q.data_ptr(), scale.data_ptr(), group_size)
    row_kernel = _row_kernel(int8_activations, q.shape[1], lib.int8_matmul_q8, lib.int8_matmul_f32)
    return _matmul(rows, *q.shape, weight, row_kernel, lib.int8_gemm_f32)


def int4_matmul(
    rows: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
    int8_activations: bool = False,
) -> torch.Tensor:
    """rows float32 [M, K] @ the int4 weight^T (quant_int4_ref.py's format, float32 scales);
    int8_activations as int8_matmul's."""
    lib = bindings.library()
    n, k = packed.shape[0], packed.shape[1] * 2
    weight = (packed.data_ptr(), scales.data_ptr(), mins.data_ptr(), group_size)
    row_kernel = _row_kernel(int8_activations, k, lib.int4_matmul_q8, lib.int4_matmul_f32)
    return _matmul(rows, n, k, weight, row_kernel, lib.int4_gemm_f32)


def _row_kernel(int8_activations: bool, k: int, integer, floats) -> tuple:
    """The row kernel to take and up to how many rows."""
    if int8_activations and k % ACTIVATION_BLOCK == 0:
        return integer, MAX_INTEGER_ROW_KERNEL_ROWS
    return floats, MAX_ROW_KERNEL_ROWS


def _matmul(rows: torch.Tensor, n: int, k: int, weight: tuple, row_kernel, gemm) -> torch.Tensor:
    """The row kernel for a few rows, the panel GEMM for more; weight is the library's arguments."""
    matmul, row_limit = row_kernel
    threads = torch.get_num_threads()
    rows = rows.contiguous()
    m = rows.shape[0]
    out = torch.empty(m, n)
    if m <= row_limit:
        matmul(rows.data_ptr(), m, rows.stride(0), *weight, n, k, out.data_ptr(), threads)
    else:
        gemm(
            rows.data_ptr(), m, rows.stride(0), *weight, n, k, out.data_ptr(), PANEL_BYTES, threads
        )
    return out
