"""How many KV-cache blocks this engine gets.

An explicit --kv-cache-memory wins. Otherwise the engine may use a fraction of
the device's memory (on CPU: of --cpu-memory-budget), minus what the weights
already take; the KV cache gets the rest.
"""

import itertools

import torch
from torch import nn

from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.settings import EngineSettings


class KvBudgetError(ValueError):
    pass


def model_bytes(model: nn.Module) -> int:
    """Memory the weights take: parameters, and buffers, where quantized layers keep theirs."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def kv_cache_bytes(settings: EngineSettings, device: torch.device, weight_bytes: int) -> int:
    if settings.kv_cache_memory:
        return settings.kv_cache_memory
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = settings.cpu_memory_budget
    available = int(total * settings.gpu_memory_utilization) - weight_bytes
    if available <= 0:
        raise KvBudgetError(
            f"no memory left for the KV cache: {weight_bytes} bytes of weights in a budget of "
            f"{int(total * settings.gpu_memory_utilization)}; raise the budget"
        )
    return available


def num_blocks(
    settings: EngineSettings, config: ModelConfig, dtype: torch.dtype, memory: int
) -> int:
    blocks = PagedKVCache.num_blocks_for_memory(memory, config, settings.block_size, dtype)
    if blocks < 1:
        per_block = PagedKVCache.bytes_per_block(config, settings.block_size, dtype)
        raise KvBudgetError(f"{memory} bytes hold no KV block ({per_block} bytes each)")
    return blocks
