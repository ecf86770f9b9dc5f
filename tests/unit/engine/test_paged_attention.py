"""Paged attention against plain causal SDPA over each whole sequence."""

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from services.engine.attention import paged_attention
from services.engine.attention_metadata import AttentionMetadata

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 8
BLOCK_SIZE = 4
NUM_BLOCKS = 64


@dataclass
class Chunk:
    context: int  # positions the sequence attends over this step: computed plus new
    new: int


chunks = st.integers(1, 30).flatmap(
    lambda context: st.builds(
        Chunk, st.just(context), st.one_of(st.just(1), st.integers(1, context))
    )
)


def slot(table: list[int], position: int) -> int:
    return table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(chunks, min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    decodes_first=st.booleans(),
)
def test_paged_attention_matches_dense_causal_attention(batch, seed, decodes_first):
    if decodes_first:
        batch.sort(key=lambda c: c.new != 1)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    # Scattered blocks; a table may already hold a block beyond the context.
    tables = [
        [free.pop() for _ in range(-(-c.context // BLOCK_SIZE) + rng.randint(0, 1))] for c in batch
    ]
    # Random, not zero: stale data in unused slots must not leak into the result.
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    q_new, k_new, v_new, positions, expected = [], [], [], [], []
    for c, table in zip(batch, tables, strict=True):
        q = torch.randn(c.context, HEADS, HEAD_DIM, generator=gen)
        k = torch.randn(c.context, KV_HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(c.context, KV_HEADS, HEAD_DIM, generator=gen)
        computed = c.context - c.new
        for position in range(computed):  # what earlier steps wrote
            k_cache.view(-1, KV_HEADS, HEAD_DIM)[slot(table, position)] = k[position]
            v_cache.view(-1, KV_HEADS, HEAD_DIM)[slot(table, position)] = v[position]
        q_new.append(q[computed:])
        k_new.append(k[computed:])
        v_new.append(v[computed:])
        positions += range(computed, c.context)
        dense = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        expected.append(dense.transpose(0, 1)[computed:])

    meta = AttentionMetadata.build(
        torch.tensor(positions),
        query_lens=[c.new for c in batch],
        context_lens=[c.context for c in batch],
        block_tables=tables,
        block_size=BLOCK_SIZE,
        device="cpu",
    )
    k, v = torch.cat(k_new), torch.cat(v_new)
    out = paged_attention(torch.cat(q_new), k, v, k_cache, v_cache, meta)

    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)
    slots = [
        slot(t, p)
        for c, t in zip(batch, tables, strict=True)
        for p in range(c.context - c.new, c.context)
    ]
    assert torch.equal(k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots], k)
    assert torch.equal(v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots], v)


def test_metadata_lays_out_decodes_then_prefill_chunks():
    # Two decodes, a chunk resuming at position 5, then a decode after it.
    query_lens, context_lens = [1, 1, 3, 1], [6, 1, 8, 2]
    tables = [[7, 2], [4], [9, 0, 3], [5, 6]]
    positions = torch.tensor([5, 0, 5, 6, 7, 1])
    meta = AttentionMetadata.build(positions, query_lens, context_lens, tables, 4, "cpu")

    assert meta.slot_mapping.tolist() == [
        2 * 4 + 1,
        4 * 4,
        0 * 4 + 1,
        0 * 4 + 2,
        0 * 4 + 3,
        5 * 4 + 1,
    ]
    assert meta.query_start_loc == [0, 1, 2, 5, 6]
    assert meta.context_lens == context_lens
    assert meta.block_tables.tolist() == [[7, 2], [4, 0], [9, 0], [5, 0]]
    assert meta.num_decodes == 2
    assert meta.decode_block_ids.tolist() == [7, 2, 4, 0]
    assert meta.decode_mask[:, 0, 0].tolist() == [
        [True] * 6 + [False] * 2,
        [True] + [False] * 7,
    ]
    assert [ids.tolist() for ids in meta.prefill_block_ids] == [[9, 0], [5]]
    assert meta.prefill_masks[0].tolist() == [
        [True] * 6 + [False] * 2,
        [True] * 7 + [False],
        [True] * 8,
    ]
    assert meta.prefill_masks[1].tolist() == [[True, True]]
