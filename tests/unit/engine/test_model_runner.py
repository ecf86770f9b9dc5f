"""ModelRunner over the tiny model: chunked, batched, forked runs against a dense forward."""

import random

import pytest
import torch

from maas_services.engine.dense_forward import dense_logits
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.sampler import make_generator
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.scheduler import ScheduledSeq
from maas_services.engine.sequence import Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 32
PROMPT = [3, 17, 42, 8, 8, 60, 5, 21, 33, 9, 14, 2, 50]


@pytest.fixture
def runner(tiny_model, tiny_config) -> ModelRunner:
    pool = PagedKVCache.allocate(tiny_config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu")
    return ModelRunner(tiny_model, tiny_config, pool, "cpu")


class Blocks:
    """Hands out scattered block ids, as a long-running pool would."""

    def __init__(self, seed: int = 0):
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def table(self, num_tokens: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-num_tokens // BLOCK_SIZE))]


def make_seq(token_ids: list[int], block_table: list[int], computed: int = 0) -> Sequence:
    return Sequence(
        request_id="r",
        index=0,
        token_ids=list(token_ids),
        num_prompt_tokens=len(token_ids),
        params=SamplingParams(),
        generator=make_generator(0),
        num_computed_tokens=computed,
        block_table=block_table,
    )


def step(runner: ModelRunner, work: list[tuple[Sequence, int]], copies=()) -> torch.Tensor:
    """Run one step and advance the sequences, as the engine does after it."""
    logits = runner.execute([ScheduledSeq(seq, n) for seq, n in work], list(copies)).logits
    for seq, n in work:
        seq.num_computed_tokens += n
    return logits


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_a_prompt_in_random_chunks_then_decodes_matches_a_dense_forward(runner, tiny_model, seed):
    rng = random.Random(seed)
    seq = make_seq(PROMPT, Blocks(seed).table(len(PROMPT) + 4))
    while seq.num_uncomputed_tokens > 0:
        n = min(rng.randint(1, 6), seq.num_uncomputed_tokens)
        logits = step(runner, [(seq, n)])
        if seq.num_uncomputed_tokens > 0:
            assert logits.shape == (0, tiny_model.config.vocab_size)
    assert_close(logits[0], dense_logits(tiny_model, PROMPT)[-1])
    for token in [7, 7, 40, 1]:
        seq.token_ids.append(token)
        logits = step(runner, [(seq, 1)])
        assert logits.dtype == torch.float32
        assert_close(logits[0], dense_logits(tiny_model, seq.token_ids)[-1])


def test_a_mixed_batch_matches_each_sequence_alone(runner, tiny_model):
    blocks = Blocks()
    prompts = {
        "decode_a": PROMPT[:9],
        "chunk_mid": PROMPT,
        "decode_b": PROMPT[4:],
        "fresh": [11, 12, 13, 14, 15],
        "decode_c": [7],
        "chunk_last": PROMPT[2:12],
    }
    seqs = {name: make_seq(ids, blocks.table(len(ids) + 1)) for name, ids in prompts.items()}
    # Earlier steps: the decodes computed all but their last token, the chunks part of theirs.
    step(runner, [(seqs["decode_a"], 8), (seqs["decode_b"], 8), (seqs["chunk_mid"], 5)])
    step(runner, [(seqs["chunk_last"], 7)])

    order = ["decode_a", "chunk_mid", "decode_b", "fresh", "decode_c", "chunk_last"]
    new = {"decode_a": 1, "chunk_mid": 4, "decode_b": 1, "fresh": 5, "decode_c": 1, "chunk_last": 3}
    logits = step(runner, [(seqs[name], new[name]) for name in order])

    sampled = [name for name in order if name != "chunk_mid"]  # it stops mid-prompt
    expected = torch.stack([dense_logits(tiny_model, prompts[name])[-1] for name in sampled])
    assert_close(logits, expected)
    rest = step(runner, [(seqs["chunk_mid"], 4)])
    assert_close(rest[0], dense_logits(tiny_model, PROMPT)[-1])


def test_a_forked_sequence_shares_the_prefix_and_copies_the_partial_block(runner, tiny_model):
    blocks = Blocks()
    prompt = PROMPT[:6]  # a full block and half of another
    parent = make_seq(prompt, blocks.table(len(prompt) + 2))
    step(runner, [(parent, len(prompt))])
    # The child shares the full block and gets its own copy of the partial one.
    copy = blocks.table(1)[0]
    child = make_seq(prompt, [parent.block_table[0], copy], computed=len(prompt))
    parent.token_ids.append(30)
    child.token_ids.append(31)
    logits = step(runner, [(parent, 1), (child, 1)], copies=[(parent.block_table[1], copy)])
    expected = [dense_logits(tiny_model, s.token_ids)[-1] for s in (parent, child)]
    assert_close(logits, torch.stack(expected))


def test_a_prefix_cache_hit_resumes_from_the_cached_blocks(runner, tiny_model):
    blocks = Blocks()
    first = make_seq(PROMPT, blocks.table(len(PROMPT)))
    step(runner, [(first, len(PROMPT))])
    # A second prompt with the same first two blocks starts at position 8.
    prompt = PROMPT[:8] + [44, 45, 46]
    second = make_seq(prompt, first.block_table[:2] + blocks.table(3), computed=8)
    logits = step(runner, [(second, 3)])
    assert_close(logits[0], dense_logits(tiny_model, prompt)[-1])


def test_copy_blocks_copies_every_layer(tiny_config):
    pool = PagedKVCache.allocate(tiny_config, 6, BLOCK_SIZE, torch.float32, "cpu")
    pool.k.normal_()
    pool.v.normal_()
    before_k, before_v = pool.k.clone(), pool.v.clone()
    pool.copy_blocks([(1, 4), (2, 5)])
    assert torch.equal(pool.k[:, [4, 5]], before_k[:, [1, 2]])
    assert torch.equal(pool.v[:, [4, 5]], before_v[:, [1, 2]])
    assert torch.equal(pool.k[:, :4], before_k[:, :4])
    assert torch.equal(pool.v[:, :4], before_v[:, :4])


def test_pool_sizing(tiny_config):
    # 2 (K and V) * 2 layers * 2 KV heads * 8 dims * 4 positions * 2 bytes
    per_block = PagedKVCache.bytes_per_block(tiny_config, BLOCK_SIZE, torch.bfloat16)
    assert per_block == 512
    assert PagedKVCache.num_blocks_for_memory(10 * 512 + 511, tiny_config, 4, torch.bfloat16) == 10
    pool = PagedKVCache.allocate(tiny_config, 10, BLOCK_SIZE, torch.bfloat16, "cpu")
    assert pool.k.shape == (2, 10, BLOCK_SIZE, 2, 8)
    assert pool.num_blocks == 10
    assert pool.k.nbytes + pool.v.nbytes == 10 * per_block
