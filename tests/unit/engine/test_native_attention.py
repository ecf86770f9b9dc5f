"""The native CPU paged decode attention against dense SDPA and the torch path."""

import random

import pytest
import torch
import torch.nn.functional as F

from maas_kernels.native import bindings
from maas_services.engine import native_attention
from maas_services.engine.attention import paged_attention
from maas_services.engine.attention_metadata import AttentionMetadata

BLOCK_SIZE = 16  # the engine's (maas_services.common.block_hash.BLOCK_SIZE)
# Around the block edges, a long one and the shortest.
CONTEXTS = [1, 15, 16, 17, 300, 2000]


@pytest.fixture(scope="module", autouse=True)
def built():
    # CI machines have a compiler and AVX2: these tests must not pass by skipping.
    assert bindings.library() is not None


def step(contexts, new, heads, kv_heads, head_dim, seed):
    """A step's q, k, v (strided views of one fused projection), its pools and metadata,
    and the dense causal attention of each sequence's new tokens over its whole context.

    Blocks are shuffled over the pool, and every slot outside a context holds large
    garbage: a read of padding, of another sequence's block or past a context shows.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-c // BLOCK_SIZE) for c in contexts]
    num_blocks = sum(needed) + 4
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in needed]
    shape = (num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen) * 1e3
    v_cache = torch.randn(shape, generator=gen) * 1e3
    flat_k, flat_v = (c.view(-1, kv_heads, head_dim) for c in (k_cache, v_cache))
    tokens = sum(new)
    fused = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q, k, v = fused.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    q, k, v = q.view(tokens, heads, head_dim), *(t.view(tokens, kv_heads, head_dim) for t in (k, v))
    expected, positions, start = [], [], 0
    for context, n, table in zip(contexts, new, tables, strict=True):
        computed = context - n
        past_k = torch.randn(computed, kv_heads, head_dim, generator=gen)
        past_v = torch.randn(computed, kv_heads, head_dim, generator=gen)
        for position in range(computed):  # what earlier steps wrote
            slot = table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE
            flat_k[slot], flat_v[slot] = past_k[position], past_v[position]
        keys = torch.cat([past_k, k[start : start + n]]).transpose(0, 1)
        values = torch.cat([past_v, v[start : start + n]]).transpose(0, 1)
        mask = torch.ones(n, context, dtype=torch.bool).tril(computed)
        dense = F.scaled_dot_product_attention(
            q[start : start + n].transpose(0, 1), keys, values, attn_mask=mask, enable_gqa=True
        )
        expected.append(dense.transpose(0, 1))
        positions += range(computed, context)
        start += n
    meta = AttentionMetadata.build(
        torch.tensor(positions), new, contexts, tables, BLOCK_SIZE, "cpu"
    )
    return (q, k, v, k_cache, v_cache, meta), torch.cat(expected)


def decodes(batch, seed, heads=9, kv_heads=3, head_dim=64):
    contexts = [random.Random(seed + i).choice(CONTEXTS) for i in range(batch)]
    # Every context at least once from 6 decodes on; the runner's order, longest first.
    contexts = sorted(CONTEXTS[:batch] + contexts[len(CONTEXTS) :], reverse=True)
    return step(contexts, [1] * batch, heads, kv_heads, head_dim, seed)


@pytest.mark.parametrize("batch", [1, 3, 33])
def test_decodes_match_dense_attention_and_the_torch_path(batch):
    args, expected = decodes(batch, seed=batch)
    q, k, v, k_cache, v_cache, meta = args
    assert native_attention.handles(q, k_cache, v_cache)
    torch_pools = k_cache.clone(), v_cache.clone()
    out = paged_attention(*args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # The native call built no decode groups: it reads the block tables in place.
    assert "decode_groups" not in vars(meta)
    with native_attention.torch_path():
        assert not native_attention.handles(q, k_cache, v_cache)
        torch_out = paged_attention(q, k, v, *torch_pools, meta)
    torch.testing.assert_close(out, torch_out, rtol=1e-5, atol=1e-5)
    # Both stored the new keys and values in the same slots.
    assert torch.equal(k_cache, torch_pools[0]) and torch.equal(v_cache, torch_pools[1])


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    # Query heads per KV head 3 (one tile), 4 (3 + 1), 6 (two tiles), 1; head_dim 32-128.
    [(9, 3, 64), (8, 2, 128), (6, 1, 32), (4, 4, 64)],
)
def test_grouped_query_heads_in_tiles(heads, kv_heads, head_dim):
    args, expected = decodes(7, seed=heads, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    torch.testing.assert_close(paged_attention(*args), expected, rtol=1e-5, atol=1e-5)


def test_a_mixed_step_stores_prefill_chunks_before_their_sdpa():
    # Decodes, a chunk resuming after 40 computed positions, a first chunk of 17.
    contexts, new = [2000, 300, 17, 1, 100, 17], [1, 1, 1, 1, 60, 17]
    args, expected = step(contexts, new, 9, 3, 64, seed=5)
    q, k, v, k_cache, v_cache, meta = args
    out = paged_attention(*args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    flat = k_cache.view(-1, 3, 64)
    assert torch.equal(flat[meta.slot_mapping], k)


def test_two_threads_give_the_one_thread_result():
    # Each output row is one thread's work in a fixed order: bit for bit.
    args, _ = decodes(33, seed=2)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = paged_attention(*args)
        torch.set_num_threads(2)
        two = paged_attention(*args)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)


def test_without_a_compiler_attention_takes_the_torch_path(without_a_compiler):
    args, expected = decodes(3, seed=4)
    assert not native_attention.handles(*args[:1], *args[3:5])
    torch.testing.assert_close(paged_attention(*args), expected, rtol=1e-5, atol=1e-5)
    assert "decode_groups" in vars(args[-1])  # the torch path built them


def rounded(args):
    """The step's tensors with every key and value (pools and new ones) rounded to bf16
    and widened back: what a bf16 pool holds, in float32."""
    q, k, v, k_cache, v_cache, meta = args
    k, v, k_cache, v_cache = (t.to(torch.bfloat16).float() for t in (k, v, k_cache, v_cache))
    return q, k, v, k_cache, v_cache, meta


@pytest.mark.parametrize("batch", [1, 3, 33])
def test_bf16_pools_give_the_float32_result_over_rounded_keys_and_values(batch):
    # Widening a bf16 entry is exact and the arithmetic is the float32 kernel's, in its
    # order: bit for bit what the float32 pools give over the rounded keys and values.
    args, _ = decodes(batch, seed=batch)
    q, k, v, k_cache, v_cache, meta = args
    float_args = rounded(args)
    pools = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    assert native_attention.handles(q, *pools)
    out = paged_attention(q, k, v, *pools, meta)
    assert torch.equal(out, paged_attention(*float_args))
    # The new keys and values went in rounded as torch rounds (to nearest even).
    assert torch.equal(pools[0].view(-1, 3, 64)[meta.slot_mapping], k.to(torch.bfloat16))
    assert torch.equal(pools[1].view(-1, 3, 64)[meta.slot_mapping], v.to(torch.bfloat16))
    # The torch path over the same bf16 pools: the same attention, to rounding.
    torch_pools = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    with native_attention.torch_path():
        torch_out = paged_attention(q, k, v, *torch_pools, meta)
    torch.testing.assert_close(out, torch_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(pools[0], torch_pools[0]) and torch.equal(pools[1], torch_pools[1])


def test_bf16_pools_round_ties_to_even_and_keep_nan_and_inf():
    args, _ = decodes(1, seed=7)
    q, k, v, k_cache, v_cache, meta = args
    # 1 + 2^-8 is halfway between two bf16 values (rounds down to even), 1 + 3 * 2^-8
    # halfway too (rounds up to even); the rest: the largest finite float, infinities, NaN.
    edge = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3.4028235e38, float("inf"), -float("inf")])
    k = k.clone()
    k.view(-1)[: edge.numel()] = edge
    k.view(-1)[edge.numel()] = float("nan")
    pools = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    paged_attention(q, k, v, *pools, meta)
    stored = pools[0].view(-1, 3, 64)[meta.slot_mapping]
    expected = k.to(torch.bfloat16)
    assert torch.equal(stored.view(torch.int16)[0, 0, :5], expected.view(torch.int16)[0, 0, :5])
    assert stored.view(-1)[edge.numel()].isnan()


def test_a_mixed_step_over_bf16_pools_reads_its_prefill_chunks_rounded():
    contexts, new = [2000, 300, 17, 1, 100, 17], [1, 1, 1, 1, 60, 17]
    args, _ = step(contexts, new, 9, 3, 64, seed=5)
    q, k, v, k_cache, v_cache, meta = args
    pools = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    out = paged_attention(q, k, v, *pools, meta)
    torch.testing.assert_close(out, paged_attention(*rounded(args)), rtol=1e-5, atol=1e-5)
