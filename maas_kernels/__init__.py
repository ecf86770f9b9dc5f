"""Triton kernels for the engine's GPU path, each beside a plain-torch twin.

Call the ops re-exported here (maas_kernels/ops.py): on CUDA tensors they run the
Triton kernel, elsewhere the twin, which computes what the engine's own torch
code computes. Each kernel module (rms_norm, activation, rotary,
paged_attention, quant_int8, quant_int4) holds one Triton kernel and its
launcher, <op>_triton; <module>_ref.py beside it holds the twin,
<op>_reference, and for the quantized matmuls the quantize and dequantize
functions that define the weight format. docs/kernels.md says where the
engine calls them (services/engine/model.py's kernel path, on CUDA).

No module is named after an op: importing kernels.<name> sets the package
attribute <name>, which would replace the op of that name re-exported here.
"""

from maas_kernels.ops import (
    int4_matmul,
    int8_matmul,
    paged_attention_decode,
    rms_norm_residual,
    rotary_embedding,
    silu_and_mul,
)

__all__ = [
    "int4_matmul",
    "int8_matmul",
    "paged_attention_decode",
    "rms_norm_residual",
    "rotary_embedding",
    "silu_and_mul",
]
