import random

import pytest
import torch

from maas_kernels.paged_attention_ref import paged_attention_decode_reference
from maas_services.engine.attention import paged_attention
from maas_services.engine.attention_metadata import AttentionMetadata
from tests.unit.kernels.tolerances import assert_close
from tests.unit.kernels.triton_import import import_kernel

paged_attention_kernel = import_kernel("paged_attention")

NUM_BLOCKS = 40
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def scattered_tables(
    contexts: list[int], block_size: int, seed: int, index_dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """Block tables over shuffled blocks, each padded out with a random block id."""
    rng = random.Random(seed)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    needed = [-(-c // block_size) for c in contexts]
    width = max(needed) + 1  # every row has padding: no kernel may read past its context
    rows = [[free.pop() for _ in range(n)] for n in needed]
    return torch.tensor(
        [row + [rng.randrange(NUM_BLOCKS) for _ in range(width - len(row))] for row in rows],
        dtype=index_dtype,
    )


def pool(block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, block_size, kv_heads, head_dim)
    return tuple(torch.randn(shape, generator=gen).to(dtype) for _ in range(2))


def test_the_twin_is_the_engines_decode_attention():
    heads, kv_heads, head_dim, block_size = 6, 2, 8, 4
    contexts = [1, 4, 9, 13]
    tables = scattered_tables(contexts, block_size, seed=1)
    k_cache, v_cache = pool(block_size, kv_heads, head_dim, torch.float32, seed=1)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(len(contexts), heads, head_dim, generator=gen)
    k_new, v_new = (torch.randn(len(contexts), kv_heads, head_dim, generator=gen) for _ in "kv")
    meta = AttentionMetadata.build(
        torch.tensor(contexts) - 1,
        query_lens=[1] * len(contexts),
        context_lens=contexts,
        block_tables=tables.tolist(),
        block_size=block_size,
        device="cpu",
    )
    # The engine writes each new token's key and value into the pool, then attends.
    expected = paged_attention(q, k_new, v_new, k_cache, v_cache, meta)
    actual = paged_attention_decode_reference(
        q, k_cache, v_cache, meta.block_tables, torch.tensor(contexts)
    )
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, block_size",
    [
        (9, 3, 64, 16),  # SmolLM2-135M at the engine's default block size
        (4, 4, 8, 4),  # no grouping
        (8, 1, 16, 4),  # every query head on one KV head
        (6, 2, 24, 6),  # head_dim and block_size not powers of two
    ],
)
def test_the_kernel_matches_its_twin(dtype, heads, kv_heads, head_dim, block_size):
    # Contexts of one token, of exactly whole blocks, and ending mid-block.
    contexts = [1, block_size, 2 * block_size + 1, 3 * block_size - 1]
    tables = scattered_tables(contexts, block_size, seed=heads)
    k_cache, v_cache = pool(block_size, kv_heads, head_dim, dtype, seed=heads)
    q = torch.randn(len(contexts), heads, head_dim, generator=torch.Generator().manual_seed(3))
    q = q.to(dtype)
    lens = torch.tensor(contexts)
    actual = paged_attention_kernel.paged_attention_decode_triton(q, k_cache, v_cache, tables, lens)
    assert_close(actual, paged_attention_decode_reference(q, k_cache, v_cache, tables, lens))


def test_the_kernel_takes_int32_tables_a_custom_scale_and_strided_queries():
    heads, kv_heads, head_dim, block_size = 4, 2, 16, 4
    contexts = [5, 11]
    tables = scattered_tables(contexts, block_size, seed=5, index_dtype=torch.int32)
    lens = torch.tensor(contexts, dtype=torch.int32)
    k_cache, v_cache = pool(block_size, kv_heads, head_dim, torch.float32, seed=5)
    # Queries as a slice of a fused projection: rows further apart than heads * head_dim.
    q = torch.randn(2, heads * head_dim + 8)[:, : heads * head_dim].view(2, heads, head_dim)
    actual = paged_attention_kernel.paged_attention_decode_triton(
        q, k_cache, v_cache, tables, lens, scale=0.3
    )
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, lens, scale=0.3)
    assert_close(actual, expected)


def test_nan_in_slots_past_a_context_does_not_reach_the_result():
    heads, kv_heads, head_dim, block_size = 4, 2, 8, 4
    contexts = [3, 6]
    tables = scattered_tables(contexts, block_size, seed=7)
    k_cache, v_cache = pool(block_size, kv_heads, head_dim, torch.float32, seed=7)
    for row, context in zip(tables, contexts, strict=True):
        last_block = row[(context - 1) // block_size]
        k_cache[last_block, context % block_size :] = float("nan")
        v_cache[last_block, context % block_size :] = float("nan")
    q = torch.randn(2, heads, head_dim)
    lens = torch.tensor(contexts)
    actual = paged_attention_kernel.paged_attention_decode_triton(q, k_cache, v_cache, tables, lens)
    assert actual.isfinite().all()
    assert_close(actual, paged_attention_decode_reference(q, k_cache, v_cache, tables, lens))


def test_the_kernel_refuses_heads_that_do_not_group_evenly():
    k_cache, v_cache = pool(4, 2, 8, torch.float32, seed=0)
    tables = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="share"):
        paged_attention_kernel.paged_attention_decode_triton(
            torch.randn(1, 3, 8), k_cache, v_cache, tables, torch.tensor([1])
        )
