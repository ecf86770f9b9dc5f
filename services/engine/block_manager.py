"""The KV-cache block pool: block tables for sequences, with a prefix cache.

Every block is in exactly one state:
- free: no hash, no references; in `free_block_ids`.
- cached: holds a hash but no references; in `cached_block_ids`, oldest release
  first. Its KV is still valid, so a new prompt with the same prefix reuses it,
  but allocation may evict it when no free block is left.
- used: referenced by at least one sequence, with or without a hash.

Only full blocks whose KV is computed get a hash, and a hashed or shared block
is never written again: a write to a shared block is copied first (append_slot).
Each sequence's hashes are salted with its own cache_salt (its tenant's, unless
shared: services/common/block_hash.py), so one pool holds every tenant's
prefixes and a lookup only ever finds those its salt may see.
"""

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Protocol

from maas_services.common.block_hash import hash_block
from maas_services.engine.block import Block
from maas_services.engine.core import protocol


class BlockSeq(Protocol):
    token_ids: list[int]  # prompt plus the tokens generated so far
    block_table: list[int]
    # Chained hashes of the leading full blocks whose KV is computed; the manager
    # extends it even where another block already caches that hash.
    block_hashes: list[int]
    num_cached_tokens: int
    cache_salt: str


class NoFreeBlocksError(RuntimeError):
    """The pool can't supply the blocks asked for; callers check can_* first."""


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        on_event: Callable[[str, list[int]], None] | None = None,
    ):
        self.block_size = block_size
        # Tells the router what this engine caches: core/protocol.py's STORED, EVICTED or
        # CLEARED.
        self.on_event = on_event
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.cached_block_ids: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[int, int] = {}

    @property
    def total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free ones and evictable cached ones."""
        return len(self.free_block_ids) + len(self.cached_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.total_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.total_blocks

    def can_allocate(self, seq: BlockSeq) -> bool:
        return self._blocks_to_take(seq, self._cache_hits(seq)) <= self.num_free_blocks

    def allocate(self, seq: BlockSeq) -> int:
        """Give `seq` blocks for all its tokens, sharing cached prefix blocks.

        Returns the number of leading tokens whose KV is already cached, which is
        also stored in seq.num_cached_tokens.
        """
        assert not seq.block_table, "sequence already holds blocks"
        hits = self._cache_hits(seq)
        if self._blocks_to_take(seq, hits) > self.num_free_blocks:
            raise NoFreeBlocksError("not enough free KV blocks for the prompt")
        # Claim the hits before taking fresh blocks so that eviction can't pick them.
        for _, block_id in hits:
            self._reference(block_id)
        fresh = self._take_blocks(self._num_blocks_for(len(seq.token_ids)) - len(hits))
        seq.block_table = [block_id for _, block_id in hits] + fresh
        seq.block_hashes = [block_hash for block_hash, _ in hits]
        seq.num_cached_tokens = len(hits) * self.block_size
        return seq.num_cached_tokens

    def can_append(self, seq: BlockSeq) -> bool:
        missing = self._num_blocks_for(len(seq.token_ids)) - len(seq.block_table)
        if missing > 0:
            return missing <= self.num_free_blocks
        return not self._newest_block_is_shared(seq) or self.num_free_blocks >= 1

    def append_slot(self, seq: BlockSeq) -> tuple[int, int] | None:
        """Make room for the KV of seq's newest token, one new token since the last call.

        Returns (src, dst) when the block to be written was shared and seq now owns
        a private copy: the caller must copy src's KV into dst before writing.
        """
        missing = self._num_blocks_for(len(seq.token_ids)) - len(seq.block_table)
        if missing > 0:
            # The newest token opens a block, which is fresh and so unshared.
            seq.block_table.extend(self._take_blocks(missing))
            return None
        if not self._newest_block_is_shared(seq):
            return None
        index = (len(seq.token_ids) - 1) // self.block_size
        src = seq.block_table[index]
        (dst,) = self._take_blocks(1)
        # ref_count was above 1, so the other holders keep src alive.
        self.blocks[src].ref_count -= 1
        seq.block_table[index] = dst
        return src, dst

    def mark_computed(self, seq: BlockSeq, num_computed_tokens: int) -> None:
        """Put the blocks filled by the first num_computed_tokens tokens into the prefix cache."""
        stored: list[int] = []
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for index in range(len(seq.block_hashes), num_computed_tokens // self.block_size):
            start = index * self.block_size
            tokens = seq.token_ids[start : start + self.block_size]
            parent = hash_block(parent, tokens, seq.cache_salt)
            seq.block_hashes.append(parent)
            # Another block already caching this prefix stays the one that is
            # shared: one hash maps to one block, and this one just goes unhashed.
            if parent in self.hash_to_block:
                continue
            block = self.blocks[seq.block_table[index]]
            block.hash = parent
            self.hash_to_block[parent] = block.block_id
            stored.append(parent)
        if stored:
            self._emit(protocol.STORED, stored)

    def fork(self, parent: BlockSeq, child: BlockSeq) -> None:
        """Let `child` share all of `parent`'s blocks, e.g. for n parallel samples of one prompt."""
        assert not child.block_table, "child already holds blocks"
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: BlockSeq) -> None:
        # Releasing the tail first puts it ahead of the head in the eviction order:
        # a prefix is worth more than its continuations, which depend on it.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.hash is None:
                self.free_block_ids.append(block_id)
            else:
                self.cached_block_ids[block_id] = None
        seq.block_table = []
        seq.block_hashes = []

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, e.g. after new weights made the cached KV stale.

        Blocks still in use lose their hashes too, so nothing computed before the
        reset is ever shared after it and the router's CLEARED view is exact.
        """
        for block_id in self.hash_to_block.values():
            self.blocks[block_id].hash = None
        self.hash_to_block.clear()
        self.free_block_ids.extend(self.cached_block_ids)
        self.cached_block_ids.clear()
        self._emit(protocol.CLEARED, [])

    def check_invariants(self, live_seqs: Iterable[BlockSeq]) -> None:
        """Assert the pool's bookkeeping is consistent with the sequences holding blocks."""
        free = set(self.free_block_ids)
        cached = set(self.cached_block_ids)
        used = {block.block_id for block in self.blocks if block.ref_count > 0}
        assert len(free) == len(self.free_block_ids), "a block is on the free list twice"
        assert not free & cached and not free & used and not cached & used, "block in two states"
        assert len(free) + len(cached) + len(used) == self.total_blocks, "a block is in no state"
        assert all(self.blocks[block_id].hash is None for block_id in free)
        assert all(self.blocks[block_id].hash is not None for block_id in cached)
        hashed = [block for block in self.blocks if block.hash is not None]
        assert self.hash_to_block == {block.hash: block.block_id for block in hashed}
        assert len(self.hash_to_block) == len(hashed), "two blocks hold one hash"
        references: Counter[int] = Counter()
        for seq in live_seqs:
            assert len(set(seq.block_table)) == len(seq.block_table), "block twice in one table"
            assert len(seq.block_hashes) <= len(seq.block_table)
            for block_id, block_hash in zip(seq.block_table, seq.block_hashes, strict=False):
                assert self.blocks[block_id].hash in (None, block_hash), "table and hashes differ"
            references.update(seq.block_table)
        for block in self.blocks:
            assert block.ref_count == references[block.block_id], f"ref_count of {block}"

    def _cache_hits(self, seq: BlockSeq) -> list[tuple[int, int]]:
        """(hash, block id) of the leading blocks of seq's tokens whose KV is cached."""
        token_ids = seq.token_ids
        hits: list[tuple[int, int]] = []
        parent = None
        # The block holding the last token never counts: at least one token must be
        # computed to get logits, and it would be written into a shared block.
        for index in range((len(token_ids) - 1) // self.block_size):
            start = index * self.block_size
            parent = hash_block(parent, token_ids[start : start + self.block_size], seq.cache_salt)
            block_id = self.hash_to_block.get(parent)
            if block_id is None:
                break
            hits.append((parent, block_id))
        return hits

    def _blocks_to_take(self, seq: BlockSeq, hits: list[tuple[int, int]]) -> int:
        """How many free-or-evictable blocks allocating seq with these hits consumes."""
        fresh = self._num_blocks_for(len(seq.token_ids)) - len(hits)
        # A hit on a cached, unreferenced block is free of compute but still leaves
        # the evictable pool once referenced.
        revived = sum(1 for _, block_id in hits if self.blocks[block_id].ref_count == 0)
        return fresh + revived

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _newest_block_is_shared(self, seq: BlockSeq) -> bool:
        block_id = seq.block_table[(len(seq.token_ids) - 1) // self.block_size]
        return self.blocks[block_id].ref_count > 1

    def _reference(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_block_ids[block_id]
        block.ref_count += 1

    def _take_blocks(self, count: int) -> list[int]:
        """Reference `count` blocks holding no valid KV, evicting cached ones when needed."""
        if count > self.num_free_blocks:
            raise NoFreeBlocksError(f"{count} KV blocks asked for, {self.num_free_blocks} free")
        taken: list[int] = []
        evicted: list[int] = []
        while len(taken) < count:
            if self.free_block_ids:
                block = self.blocks[self.free_block_ids.popleft()]
            else:
                block_id, _ = self.cached_block_ids.popitem(last=False)
                block = self.blocks[block_id]
                del self.hash_to_block[block.hash]
                evicted.append(block.hash)
                block.hash = None
            block.ref_count = 1
            taken.append(block.block_id)
        if evicted:
            self._emit(protocol.EVICTED, evicted)
        return taken

    def _emit(self, kind: str, hashes: list[int]) -> None:
        if self.on_event is not None:
            self.on_event(kind, hashes)
