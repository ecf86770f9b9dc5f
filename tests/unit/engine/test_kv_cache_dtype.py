"""--kv-cache-dtype: the pool's dtype from the setting and the model's dtype."""

import pytest
import torch

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.device import resolve_kv_cache_dtype
from maas_services.engine.machine_defaults import machine_kv_cache_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_model_keeps_the_models_dtype_and_bf16_narrows_a_float32_model():
    assert resolve_kv_cache_dtype("model", torch.float32, CPU) == torch.float32
    assert resolve_kv_cache_dtype("model", torch.bfloat16, CUDA) == torch.bfloat16
    assert resolve_kv_cache_dtype("bf16", torch.float32, CPU) == torch.bfloat16
    assert resolve_kv_cache_dtype("bf16", torch.bfloat16, CUDA) == torch.bfloat16


def test_auto_is_this_machines_row():
    row = machine_kv_cache_dtype(machine_profile(), on_cuda=False).value
    expected = torch.float32 if row == "model" else torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.float32, CPU) == expected


def test_cuda_refuses_a_pool_narrower_than_its_queries():
    # The Triton decode kernel reads the pool in the queries' dtype.
    with pytest.raises(ValueError, match="--dtype bfloat16"):
        resolve_kv_cache_dtype("bf16", torch.float32, CUDA)
