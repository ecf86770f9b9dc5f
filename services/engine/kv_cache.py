"""One sequence's keys and values, preallocated so decoding never reallocates."""

from dataclasses import dataclass

import torch

from services.engine.model_config import ModelConfig


@dataclass
class KVCache:
    # [layers, kv_heads, max_len, head_dim]: heads before positions so that the
    # filled prefix of one layer is already the [heads, len, dim] view attention wants.
    k: torch.Tensor
    v: torch.Tensor
    length: int = 0  # positions written so far, identical for every layer

    @classmethod
    def allocate(
        cls, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> "KVCache":
        shape = (config.num_layers, config.num_kv_heads, max_len, config.head_dim)
        return cls(
            k=torch.empty(shape, dtype=dtype, device=device),
            v=torch.empty(shape, dtype=dtype, device=device),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[2]
