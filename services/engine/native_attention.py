"""CPU paged decode attention in one native call per layer: native/attention.cpp.

The pools are float32 or bf16 (--kv-cache-dtype bf16: each key and value rounded
as torch rounds, read back widened, half the bytes a decode reads); the queries
and the arithmetic are float32 either way.

The call writes the step's new keys and values into their pool slots (every
token's, prefill chunks' included, so their SDPA after it reads them) and
attends each decode over its own blocks in place, through its block table:
no gather into a buffer padded to a group's longest, no mask. Where the
library cannot be built, library() is None and attention keeps its torch path.
"""

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from maas_kernels import ops
from maas_kernels.native import bindings
from maas_services.engine.attention_metadata import AttentionMetadata

# The value pass holds 32 floats of head_dim per query head in registers.
_HEAD_DIM_MULTIPLE = 32


# Set inside torch_path(): the torch path's tests and the benchmarks' A/B run it on
# a machine that has the library.
_off = False


@contextmanager
def torch_path() -> Iterator[None]:
    """Attention takes its torch path inside this block, library or not."""
    global _off
    previous, _off = _off, True
    try:
        yield
    finally:
        _off = previous


# The pools' entry types the library reads.
_POOL_DTYPES = (torch.float32, torch.bfloat16)


def handles(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the native call runs this layer: float32 queries on a CPU, outside force_triton."""
    # force_triton sends CPU tensors to the Triton kernels (the interpreter tests the
    # CUDA wiring on a CPU): then they must get them.
    return q.device.type == "cpu" and q.dtype == torch.float32 and handles_pool(k_cache, v_cache)


def handles_pool(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """handles() for whatever float32 CPU queries these pools get (native_layers.py's
    decode step asks before it has any)."""
    return (
        k_cache.device.type == "cpu"
        and not ops._force_triton
        and not _off
        and k_cache.dtype == v_cache.dtype
        and k_cache.dtype in _POOL_DTYPES
        and k_cache.shape[-1] % _HEAD_DIM_MULTIPLE == 0
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and bindings.library() is not None
    )


def store_and_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    library: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Every token's k, v into the pool; returns [tokens, heads, head_dim], decode rows filled.

    The rows after the decodes (prefill chunks' queries) are left for the caller. library
    is the engine's build unless given (benchmarks/library_ab.py times another's).
    """
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tokens, heads, head_dim = q.shape
    out = torch.empty(q.shape, dtype=torch.float32)
    tables = meta.block_tables
    # Positional, in the signature's order: at batch 1 the whole call is ~20 us of
    # kernel, so each wrapper microsecond shows.
    (library or bindings.library()).paged_attention_decode(
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        k.data_ptr(),
        k.stride(0),
        k.stride(1),
        v.data_ptr(),
        v.stride(0),
        v.stride(1),
        meta.slot_mapping.data_ptr(),
        tokens,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.dtype == torch.bfloat16,
        tables.data_ptr(),
        tables.stride(0),
        meta.decode_context_lens.data_ptr(),
        meta.num_decodes,
        heads,
        k_cache.shape[2],
        head_dim,
        k_cache.shape[1],
        head_dim**-0.5,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out
