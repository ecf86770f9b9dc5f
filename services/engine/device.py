"""Device and dtype selection.

On CPUs with AMX or AVX512-BF16, bfloat16 matmuls run several times faster
than float32, so "auto" serves in bfloat16 there and on CUDA; float32 stays
the exactness reference for tests against transformers.
"""

import torch

# Imported by name elsewhere (services.distill).
from services.common.cpu_flags import has_native_bf16 as cpu_has_native_bf16

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda" or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32
