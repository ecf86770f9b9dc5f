"""Paged attention against plain causal SDPA over each whole sequence."""

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from maas_services.engine.attention import paged_attention
from maas_services.engine.attention_metadata import AttentionMetadata

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
    # Small budgets cut the decodes into several groups, each padded to its longest.
    group_positions=st.sampled_from([1, 8, 24, 1024]),
)
def test_paged_attention_matches_dense_causal_attention(
    batch, seed, decodes_first, group_positions
):
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
        group_positions=group_positions,
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
    # Both decodes fit one group: longest first, the shorter padded with block 0.
    [group] = meta.decode_groups
    assert group.rows.tolist() == [0, 1]
    assert group.block_ids.tolist() == [7, 2, 4, 0]
    assert group.positions == 6
    assert group.mask[:, 0, 0].tolist() == [[True] * 6, [True] + [False] * 5]
    assert [ids.tolist() for ids in meta.prefill_block_ids] == [[9, 0], [5]]
    assert meta.prefill_masks[0].tolist() == [
        [True] * 6 + [False] * 2,
        [True] * 7 + [False],
        [True] * 8,
    ]
    assert meta.prefill_masks[1].tolist() == [[True, True]]


def test_decodes_are_grouped_longest_first_within_the_gather_budget():
    context_lens = [5, 20, 3, 20, 9]
    tables = [[1, 2], [3, 4, 5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15, 16]]
    meta = AttentionMetadata.build(
        torch.tensor(context_lens) - 1,
        query_lens=[1] * 5,
        context_lens=context_lens,
        block_tables=tables,
        block_size=4,
        device="cpu",
        group_positions=16,
    )
    groups = meta.decode_groups
    # A decode longer than the budget goes alone; 5 and 3 pad to 2 blocks each: 16 positions.
    assert [g.rows.tolist() for g in groups] == [[1], [3], [4], [0, 2]]
    assert [g.block_ids.tolist() for g in groups] == [
        [3, 4, 5, 6, 7],
        [9, 10, 11, 12, 13],
        [14, 15, 16],
        [1, 2, 8, 0],
    ]
    assert [g.positions for g in groups] == [20, 20, 9, 5]
    assert [g.mask is None for g in groups] == [True, True, True, False]
    assert groups[3].mask[:, 0, 0].tolist() == [[True] * 5, [True] * 3 + [False] * 2]


def test_grouped_decodes_read_only_their_own_context():
    # SmolLM2-135M's attention shape at the engine's block size, many groups.
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    contexts = [rng.randint(1, 300) for _ in range(40)]
    needed = [-(-c // block_size) for c in contexts]
    num_blocks = sum(needed) + 8
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in needed]
    # Every slot starts as large garbage: a read of another sequence's block, of
    # padding or of a position past a context would move the result far off.
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen) * 1e3
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen) * 1e3
    flat_k, flat_v = (c.view(-1, kv_heads, head_dim) for c in (k_cache, v_cache))
    q = torch.randn(len(contexts), heads, head_dim, generator=gen)
    expected, k_new, v_new = [], [], []
    for i, (context, table) in enumerate(zip(contexts, tables, strict=True)):
        k = torch.randn(context, kv_heads, head_dim, generator=gen)
        v = torch.randn(context, kv_heads, head_dim, generator=gen)
        for position in range(context - 1):  # what earlier steps wrote
            slot = table[position // block_size] * block_size + position % block_size
            flat_k[slot], flat_v[slot] = k[position], v[position]
        dense = F.scaled_dot_product_attention(
            q[i, :, None], k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True
        )
        expected.append(dense[:, 0])
        k_new.append(k[-1])
        v_new.append(v[-1])
    meta = AttentionMetadata.build(
        torch.tensor(contexts) - 1, [1] * len(contexts), contexts, tables, block_size, "cpu"
    )
    assert len(meta.decode_groups) > 4
    out = paged_attention(q, torch.stack(k_new), torch.stack(v_new), k_cache, v_cache, meta)
    torch.testing.assert_close(out, torch.stack(expected), atol=1e-4, rtol=1e-4)


def test_decodes_longest_first_are_slices_of_the_batch():
    # The runner's order (longest context first): every group is consecutive rows,
    # so attention slices the batch; out of that order a group names its rows.
    def groups(context_lens):
        meta = AttentionMetadata.build(
            torch.tensor(context_lens) - 1,
            query_lens=[1] * len(context_lens),
            context_lens=context_lens,
            block_tables=[list(range(-(-n // 4))) for n in context_lens],
            block_size=4,
            device="cpu",
            group_positions=16,
        )
        return [(g.rows.tolist(), g.first) for g in meta.decode_groups]

    assert groups([20, 9, 5, 3]) == [([0], 0), ([1], 1), ([2, 3], 2)]
    assert groups([3, 20, 5, 9]) == [([1], 1), ([3], 3), ([2, 0], None)]


@pytest.mark.parametrize(("table", "first_block"), [([5, 6, 7], 5), ([5, 7, 6], None)])
def test_a_lone_decode_over_consecutive_blocks_reads_them_in_place(table, first_block):
    gen = torch.Generator().manual_seed(3)
    context = 10
    # Garbage everywhere else: a read outside the table's blocks would show.
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen) * 1e3
    v_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen) * 1e3
    q = torch.randn(1, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen)
    for position in range(context - 1):
        k_cache.view(-1, KV_HEADS, HEAD_DIM)[slot(table, position)] = k[position]
        v_cache.view(-1, KV_HEADS, HEAD_DIM)[slot(table, position)] = v[position]
    meta = AttentionMetadata.build(
        torch.tensor([context - 1]), [1], [context], [table], BLOCK_SIZE, "cpu"
    )
    assert meta.decode_groups[0].first_block == first_block
    out = paged_attention(q, k[-1:], v[-1:], k_cache, v_cache, meta)
    dense = F.scaled_dot_product_attention(
        q[0, :, None], k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True
    )
    torch.testing.assert_close(out, dense[None, :, 0], atol=1e-4, rtol=1e-4)
