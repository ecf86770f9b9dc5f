"""The paged KV-cache pool: fixed-size blocks of keys and values shared by all sequences."""

from dataclasses import dataclass

import torch

from maas_services.engine.model_config import ModelConfig


@dataclass
class PagedKVCache:
    # [layers, blocks, block_size, kv_heads, head_dim]. A block is one contiguous
    # chunk per layer, so gathering a batch's blocks is a row copy, and the
    # gathered [tokens, heads, dim] transposes into the view attention wants
    # without another copy.
    k: torch.Tensor
    v: torch.Tensor
    block_size: int

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> "PagedKVCache":
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # Zeros, not empty: attention reads never-written slots under its padding
        # mask, and a NaN there would survive the mask (NaN * 0 weight is NaN).
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            block_size=block_size,
        )

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim
        return per_token * block_size * dtype.itemsize

    @staticmethod
    def num_blocks_for_memory(
        memory_bytes: int, config: ModelConfig, block_size: int, dtype: torch.dtype
    ) -> int:
        return memory_bytes // PagedKVCache.bytes_per_block(config, block_size, dtype)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every layer's keys and values of each source block into its destination."""
        if not pairs:
            return
        src, dst = (torch.tensor(ids, device=self.k.device) for ids in zip(*pairs, strict=True))
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
