import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from maas_services.common.block_hash import prefix_block_hashes
from maas_services.engine.block_manager import BlockManager, NoFreeBlocksError


@dataclass
class FakeSeq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    cache_salt: str = ""
    # Test-side only: how many leading tokens' KV the fake model has written.
    computed: int = 0


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, list[int]]] = []

    def __call__(self, kind: str, hashes: list[int]) -> None:
        self.events.append((kind, hashes))


def make(num_blocks: int, block_size: int = 4) -> tuple[BlockManager, Recorder]:
    recorder = Recorder()
    return BlockManager(num_blocks, block_size, on_event=recorder), recorder


def run_prompt(manager: BlockManager, tokens: list[int]) -> FakeSeq:
    """Allocate a sequence and compute its whole prompt, as a prefill does."""
    seq = FakeSeq(list(tokens))
    manager.allocate(seq)
    manager.mark_computed(seq, len(tokens))
    return seq


def test_allocate_covers_every_token():
    manager, _ = make(8)
    seq = FakeSeq(list(range(10)))
    assert manager.can_allocate(seq)
    assert manager.allocate(seq) == 0
    assert len(seq.block_table) == 3 and seq.num_cached_tokens == 0 and seq.block_hashes == []
    assert manager.num_used_blocks == 3 and manager.num_free_blocks == 5
    assert manager.usage == 3 / 8 and manager.total_blocks == 8
    manager.check_invariants([seq])


def test_mark_computed_registers_full_blocks_once():
    manager, recorder = make(8)
    seq = FakeSeq(list(range(10)))
    manager.allocate(seq)
    manager.mark_computed(seq, 5)  # a chunk of a prefill: one full block
    hashes = prefix_block_hashes(seq.token_ids, 4)
    assert seq.block_hashes == hashes[:1]
    manager.mark_computed(seq, 10)
    assert seq.block_hashes == hashes
    assert recorder.events == [("stored", hashes[:1]), ("stored", hashes[1:])]
    manager.mark_computed(seq, 10)
    assert len(recorder.events) == 2
    manager.check_invariants([seq])


def test_prefix_hit_shares_blocks_and_reports_cached_tokens():
    manager, _ = make(8)
    first = run_prompt(manager, list(range(10)))
    second = FakeSeq(list(range(8)) + [50, 51, 52])
    assert manager.allocate(second) == 8
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    assert second.block_hashes == first.block_hashes
    assert [manager.blocks[b].ref_count for b in second.block_table] == [2, 2, 1]
    manager.check_invariants([first, second])


def test_prefix_hit_on_a_freed_sequence_revives_its_blocks():
    manager, _ = make(4)
    first = run_prompt(manager, list(range(9)))
    head = first.block_table[:2]
    manager.free(first)
    assert manager.num_free_blocks == 4
    second = FakeSeq(list(range(8)) + [7])
    assert manager.allocate(second) == 8
    assert second.block_table[:2] == head
    assert manager.num_free_blocks == 1
    manager.check_invariants([second])


def test_full_prompt_hit_still_computes_the_last_block():
    manager, recorder = make(8)
    first = run_prompt(manager, list(range(8)))
    second = FakeSeq(list(range(8)))
    assert manager.allocate(second) == 4
    assert second.block_table[0] == first.block_table[0]
    assert second.block_table[1] != first.block_table[1]
    recorder.events.clear()
    manager.mark_computed(second, 8)
    # The last block's prefix is already cached in first's block: no duplicate.
    assert recorder.events == []
    assert second.block_hashes == first.block_hashes
    assert manager.blocks[second.block_table[1]].hash is None
    assert manager.hash_to_block[first.block_hashes[1]] == first.block_table[1]
    manager.check_invariants([first, second])


def test_one_block_prompt_is_never_a_hit():
    manager, _ = make(4)
    run_prompt(manager, [1, 2, 3, 4])
    assert manager.allocate(FakeSeq([1, 2, 3, 4])) == 0


def test_lru_evicts_tails_before_heads_and_oldest_first():
    manager, recorder = make(4, block_size=2)
    a = run_prompt(manager, [1, 1, 2, 2])
    c = run_prompt(manager, [3, 3, 4, 4])
    a_hashes, c_hashes = a.block_hashes, c.block_hashes
    manager.free(a)
    manager.free(c)
    recorder.events.clear()

    d = FakeSeq([9, 9])
    manager.allocate(d)
    assert recorder.events == [("evicted", [a_hashes[1]])]
    e = FakeSeq([8, 8, 8])
    manager.allocate(e)
    assert recorder.events[1:] == [("evicted", [a_hashes[0], c_hashes[1]])]
    assert set(manager.hash_to_block) == {c_hashes[0]}
    manager.check_invariants([d, e])


def test_a_hit_makes_a_cached_block_recently_used():
    manager, recorder = make(4, block_size=2)
    a = run_prompt(manager, [1, 1, 2, 2])
    c = run_prompt(manager, [3, 3, 4, 4])
    a_head = a.block_hashes[0]
    manager.free(a)
    manager.free(c)
    reuse = FakeSeq([1, 1, 5])  # hits a's head, takes a fresh block for its tail
    manager.allocate(reuse)
    manager.free(reuse)
    recorder.events.clear()
    manager.allocate(FakeSeq([6, 6, 6, 6, 6, 6, 6]))
    evicted = [h for kind, hashes in recorder.events for h in hashes if kind == "evicted"]
    assert evicted[-1] == a_head


def test_fork_then_append_copies_the_shared_partial_block():
    manager, _ = make(8)
    parent = run_prompt(manager, [1, 2, 3, 4, 5])
    child = FakeSeq(list(parent.token_ids))
    manager.fork(parent, child)
    assert child.block_table == parent.block_table
    assert child.block_hashes == parent.block_hashes
    assert all(manager.blocks[b].ref_count == 2 for b in parent.block_table)
    manager.check_invariants([parent, child])

    shared_tail = parent.block_table[1]
    parent.token_ids.append(6)
    assert manager.can_append(parent)
    src, dst = manager.append_slot(parent)
    assert src == shared_tail and parent.block_table[1] == dst != shared_tail
    assert parent.block_table[0] == child.block_table[0]
    manager.check_invariants([parent, child])

    child.token_ids.append(7)
    assert manager.append_slot(child) is None  # now the tail's only holder
    assert child.block_table[1] == shared_tail
    manager.check_invariants([parent, child])


def test_fork_on_a_block_boundary_needs_no_copy():
    manager, _ = make(8)
    parent = run_prompt(manager, [1, 2, 3, 4])
    child = FakeSeq(list(parent.token_ids))
    manager.fork(parent, child)
    for seq in (parent, child):
        seq.token_ids.append(9)
        assert manager.append_slot(seq) is None
    assert parent.block_table[1] != child.block_table[1]
    manager.check_invariants([parent, child])


def test_append_slot_opens_a_block_only_on_a_boundary():
    manager, _ = make(2)
    seq = run_prompt(manager, [1, 2, 3])
    seq.token_ids.append(4)
    assert manager.append_slot(seq) is None and len(seq.block_table) == 1
    seq.token_ids.append(5)
    assert manager.append_slot(seq) is None and len(seq.block_table) == 2
    assert manager.num_free_blocks == 0
    manager.check_invariants([seq])


def test_can_append_is_false_when_the_pool_is_exhausted():
    manager, _ = make(1)
    seq = run_prompt(manager, [1, 2, 3, 4])
    seq.token_ids.append(5)
    assert not manager.can_append(seq)
    with pytest.raises(NoFreeBlocksError):
        manager.append_slot(seq)
    manager.check_invariants([seq])


def test_copy_on_write_needs_a_free_block():
    manager, _ = make(1)
    parent = run_prompt(manager, [1, 2])
    child = FakeSeq(list(parent.token_ids))
    manager.fork(parent, child)
    parent.token_ids.append(3)
    assert not manager.can_append(parent)


def test_free_returns_blocks_to_the_right_pools():
    manager, _ = make(4)
    seq = run_prompt(manager, list(range(6)))
    full, partial = seq.block_table
    manager.free(seq)
    assert seq.block_table == [] and seq.block_hashes == []
    assert manager.num_free_blocks == 4 and manager.num_used_blocks == 0
    assert partial in manager.free_block_ids
    assert list(manager.cached_block_ids) == [full]
    manager.check_invariants([])


def test_can_allocate_is_false_when_the_pool_is_too_small():
    manager, _ = make(2)
    seq = FakeSeq(list(range(9)))
    assert not manager.can_allocate(seq)
    with pytest.raises(NoFreeBlocksError):
        manager.allocate(seq)
    assert seq.block_table == [] and manager.num_free_blocks == 2
    manager.check_invariants([])


def test_can_allocate_counts_evictable_hits_against_the_pool():
    manager, _ = make(3, block_size=2)
    manager.free(run_prompt(manager, [1, 2, 3, 4]))  # two cached blocks
    other = FakeSeq([9])
    manager.allocate(other)  # takes the only truly free block
    seq = FakeSeq([1, 2, 3, 4, 5])
    # One fresh block would fit among the two evictable ones, but reviving the two
    # hits takes those very blocks out of the pool.
    assert not manager.can_allocate(seq)
    manager.free(other)
    assert manager.can_allocate(seq)
    assert manager.allocate(seq) == 4
    assert manager.num_free_blocks == 0
    manager.check_invariants([seq])


def test_hits_on_used_blocks_cost_nothing():
    manager, _ = make(3, block_size=2)
    live = run_prompt(manager, [1, 2, 3, 4])
    seq = FakeSeq([1, 2, 3, 4, 5])
    assert manager.num_free_blocks == 1
    assert manager.can_allocate(seq)
    assert manager.allocate(seq) == 4
    manager.check_invariants([live, seq])


def test_reset_prefix_cache_forgets_every_prefix():
    manager, recorder = make(4)
    kept = run_prompt(manager, list(range(5)))
    manager.free(run_prompt(manager, [9, 9, 9, 9, 9]))
    manager.reset_prefix_cache()
    assert recorder.events[-1] == ("cleared", [])
    assert manager.hash_to_block == {} and not manager.cached_block_ids
    assert manager.num_free_blocks == 2
    again = FakeSeq(list(range(5)))
    assert manager.allocate(again) == 0
    assert kept.block_hashes == prefix_block_hashes(kept.token_ids, 4)
    manager.check_invariants([kept, again])


def test_salt_flows_into_the_hashes():
    manager = BlockManager(4, 2)
    seq = FakeSeq([1, 2, 3, 4], cache_salt="adapter-a")
    manager.allocate(seq)
    manager.mark_computed(seq, 4)
    assert seq.block_hashes == prefix_block_hashes([1, 2, 3, 4], 2, salt="adapter-a")


@given(
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=20),
    block_size=st.integers(1, 4),
)
def test_a_repeated_prompt_hits_every_block_before_its_last_token(prompt, block_size):
    manager = BlockManager(40, block_size)
    run_prompt(manager, prompt)
    again = FakeSeq(list(prompt))
    assert manager.allocate(again) == (len(prompt) - 1) // block_size * block_size


class BlockManagerMachine(RuleBasedStateMachine):
    """Random workloads over a tiny pool and vocabulary, so prefixes collide often.

    A fake model writes each token into a simulated KV pool; every step checks
    the bookkeeping, that each computed position of a live sequence still holds
    its token (nothing was evicted, overwritten or shared wrongly), and that the
    event stream mirrors the prefix cache exactly, as the router relies on.
    """

    @initialize(num_blocks=st.integers(3, 16), block_size=st.integers(1, 3))
    def setup(self, num_blocks, block_size):
        self.block_size = block_size
        self.manager = BlockManager(num_blocks, block_size, on_event=self.on_event)
        self.seqs: list[FakeSeq] = []
        self.kv: dict[int, list[int | None]] = {}
        self.mirror: set[int] = set()
        self.prompts: list[list[int]] = []

    def on_event(self, kind: str, hashes: list[int]) -> None:
        if kind == "stored":
            assert hashes and not self.mirror & set(hashes)
            self.mirror |= set(hashes)
        elif kind == "evicted":
            assert hashes and set(hashes) <= self.mirror
            self.mirror -= set(hashes)
        else:
            assert kind == "cleared" and hashes == []
            self.mirror.clear()

    def ready(self) -> list[FakeSeq]:
        """Live seqs whose every token is computed: they may decode or fork."""
        return [s for s in self.seqs if s.computed == len(s.token_ids)]

    def pending(self) -> list[FakeSeq]:
        return [s for s in self.seqs if s.computed < len(s.token_ids)]

    def fits(self, prompt: list[int], salt: str) -> bool:
        """Whether a prompt fits the pool, worked out from the events and the live tables."""
        live_blocks = {block_id for seq in self.seqs for block_id in seq.block_table}
        before_last_token = (len(prompt) - 1) // self.block_size
        hits = prefix_block_hashes(prompt, self.block_size, salt)[:before_last_token]
        in_use = 0
        for block_hash in itertools.takewhile(self.mirror.__contains__, hits):
            in_use += self.manager.hash_to_block[block_hash] in live_blocks
        # Only hits on blocks some live seq already holds come for nothing.
        needed = -(-len(prompt) // self.block_size) - in_use
        return needed <= self.manager.num_free_blocks

    @rule(data=st.data())
    def add(self, data):
        prompt = data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=4))
        # Real traffic repeats system prompts and conversations: often extend an
        # earlier prompt's prefix so the cache gets hits.
        if self.prompts and data.draw(st.booleans()):
            earlier = data.draw(st.sampled_from(self.prompts))
            prompt = earlier[: data.draw(st.integers(0, len(earlier)))] + prompt
        self.prompts.append(prompt)
        # Two tenants' salts in one pool: a hit never crosses from one to the other.
        salt = data.draw(st.sampled_from(["s\x00a", "s\x00b"]))
        seq = FakeSeq(list(prompt), cache_salt=salt)
        assert self.manager.can_allocate(seq) == self.fits(prompt, salt)
        if not self.manager.can_allocate(seq):
            with pytest.raises(NoFreeBlocksError):
                self.manager.allocate(seq)
            assert seq.block_table == []
            return
        cached = self.manager.allocate(seq)
        assert cached % self.block_size == 0 and 0 <= cached < len(prompt)
        # The hit stops only at a miss or at the block holding the last token.
        hashes = prefix_block_hashes(prompt, self.block_size, salt=salt)
        next_block = cached // self.block_size
        if next_block < (len(prompt) - 1) // self.block_size:
            assert hashes[next_block] not in self.mirror
        seq.computed = cached
        self.seqs.append(seq)

    @precondition(lambda self: self.pending())
    @rule(data=st.data())
    def compute(self, data):
        seq = data.draw(st.sampled_from(self.pending()))
        chunk = data.draw(st.integers(1, len(seq.token_ids) - seq.computed))
        end = seq.computed + chunk
        for position in range(seq.computed, end):
            block = self.manager.blocks[seq.block_table[position // self.block_size]]
            assert block.ref_count == 1 and block.hash is None, "wrote a shared or cached block"
            slots = self.kv.setdefault(block.block_id, [None] * self.block_size)
            slots[position % self.block_size] = seq.token_ids[position]
        self.manager.mark_computed(seq, end)
        seq.computed = end

    @precondition(lambda self: self.ready())
    @rule(data=st.data())
    def decode(self, data):
        seq = data.draw(st.sampled_from(self.ready()))
        seq.token_ids.append(data.draw(st.integers(0, 1)))
        if not self.manager.can_append(seq):
            with pytest.raises(NoFreeBlocksError):
                self.manager.append_slot(seq)
            # Preempt as the scheduler would; re-adding it later recomputes it,
            # reusing whatever of its KV is still cached.
            self.seqs.remove(seq)
            self.manager.free(seq)
            self.prompts.append(seq.token_ids)
            return
        copy = self.manager.append_slot(seq)
        if copy is not None:
            src, dst = copy
            self.kv[dst] = list(self.kv[src])

    @precondition(lambda self: self.ready())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.ready()))
        child = FakeSeq(
            list(parent.token_ids), cache_salt=parent.cache_salt, computed=parent.computed
        )
        self.manager.fork(parent, child)
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1)))
        self.manager.free(seq)
        assert seq.block_table == [] and seq.block_hashes == []

    @precondition(lambda self: self.mirror)
    @rule()
    def reset(self):
        self.manager.reset_prefix_cache()

    @invariant()
    def consistent(self):
        self.manager.check_invariants(self.seqs)
        assert self.mirror == set(self.manager.hash_to_block)
        for seq in self.seqs:
            assert len(seq.block_table) * self.block_size >= len(seq.token_ids)
            expected = prefix_block_hashes(
                seq.token_ids[: seq.computed], self.block_size, seq.cache_salt
            )
            assert seq.block_hashes == expected
            for position in range(seq.computed):
                block_id = seq.block_table[position // self.block_size]
                assert self.kv[block_id][position % self.block_size] == seq.token_ids[position]


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
