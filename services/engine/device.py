"""Device and dtype selection.

"auto" is the machine's dtype (services/engine/machine_defaults.py): on CPUs
with AMX or AVX512-BF16 bfloat16 matmuls run several times faster than
float32, so it serves in bfloat16 there and on CUDA; float32 stays the
exactness reference for tests against transformers.
"""

import torch

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.machine_defaults import machine_dtype

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    return _DTYPES[machine_dtype(machine_profile(), device.type == "cuda").value]
