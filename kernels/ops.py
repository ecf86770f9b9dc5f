"""The kernels as the engine calls them: Triton on CUDA tensors, the torch twin anywhere else.

Each function takes the same arguments as its two implementations and picks by
the device of its first tensor. The Triton modules are imported on first use
on a GPU, so CPU serving never needs triton installed; a CUDA build of torch
brings triton with it.

force_triton() makes every op take the Triton kernel whatever the device: with
TRITON_INTERPRET=1 set before the kernel modules are first imported, Triton's
interpreter then runs them on CPU tensors, which is how the tests check the
engine's CUDA path on a machine without a GPU.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from maas_kernels.activation_ref import silu_and_mul_reference
from maas_kernels.paged_attention_ref import paged_attention_decode_reference
from maas_kernels.quant_int4_ref import int4_matmul_reference
from maas_kernels.quant_int8_ref import int8_matmul_reference
from maas_kernels.rms_norm_ref import rms_norm_residual_reference
from maas_kernels.rotary_ref import rotary_embedding_reference

# Read by every op; only force_triton() sets it. A plain module global, not
# thread-local: it is meant for tests, which run one forward at a time.
_force_triton = False


@contextmanager
def force_triton() -> Iterator[None]:
    """Inside the block, every op runs its Triton kernel, CPU tensors included (tests only).

    On the CPU that needs TRITON_INTERPRET=1 in the environment before the
    first kernel module is imported: triton.jit decides then whether a kernel
    is compiled for a GPU or interpreted.
    """
    global _force_triton
    previous, _force_triton = _force_triton, True
    try:
        yield
    finally:
        _force_triton = previous


def uses_triton(x: torch.Tensor) -> bool:
    """Whether the ops take their Triton kernel for x (a CUDA tensor, or forced)."""
    return x.is_cuda or _force_triton


def rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda or _force_triton:
        from maas_kernels.rms_norm import rms_norm_residual_triton

        return rms_norm_residual_triton(x, residual, weight, eps)
    return rms_norm_residual_reference(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda or _force_triton:
        from maas_kernels.activation import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return silu_and_mul_reference(x)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.is_cuda or _force_triton:
        from maas_kernels.rotary import rotary_embedding_triton

        return rotary_embedding_triton(q, k, cos, sin)
    return rotary_embedding_reference(q, k, cos, sin)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    if q.is_cuda or _force_triton:
        from maas_kernels.paged_attention import paged_attention_decode_triton

        return paged_attention_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_attention_decode_reference(q, k_cache, v_cache, block_tables, context_lens, scale)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if x.is_cuda or _force_triton:
        from maas_kernels.quant_int8 import int8_matmul_triton

        return int8_matmul_triton(x, q, scale)
    return int8_matmul_reference(x, q, scale)


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    if x.is_cuda or _force_triton:
        from maas_kernels.quant_int4 import int4_matmul_triton

        return int4_matmul_triton(x, packed, scales, mins, group_size)
    return int4_matmul_reference(x, packed, scales, mins, group_size)
