"""Device and dtype selection.

"auto" is the machine's dtype (services/engine/machine_defaults.py): on CPUs
with AMX or AVX512-BF16 bfloat16 matmuls run several times faster than
float32, so it serves in bfloat16 there and on CUDA; float32 stays the
exactness reference for tests against transformers.
"""

import torch

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.machine_defaults import machine_dtype, machine_kv_cache_dtype

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    return _DTYPES[machine_dtype(machine_profile(), device.type == "cuda").value]


def resolve_kv_cache_dtype(
    name: str, model_dtype: torch.dtype, device: torch.device
) -> torch.dtype:
    """The KV pool's dtype for --kv-cache-dtype: the model's, or bf16."""
    on_cuda = device.type == "cuda"
    if name == "auto":
        name = machine_kv_cache_dtype(machine_profile(), on_cuda).value
    if name == "model":
        return model_dtype
    if on_cuda and model_dtype != torch.bfloat16:
        # The Triton decode kernel reads the pool in the queries' dtype.
        raise ValueError(f"--kv-cache-dtype bf16 on CUDA needs --dtype bfloat16, not {model_dtype}")
    return torch.bfloat16
