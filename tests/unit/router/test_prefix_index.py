"""The index against the engine's real block manager: what it caches, and nothing else."""

import random
from dataclasses import dataclass, field

from maas.v1 import engine_pb2
from maas_services.engine.block_manager import BlockManager
from maas_services.router.kv_events import apply_batch
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex
from maas_services.router.scorers.prefix import PrefixScorer
from tests.unit.router.helpers import blocks, context, endpoint

KIND = engine_pb2.KvEvent.Kind
KINDS = {"stored": KIND.KIND_STORED, "evicted": KIND.KIND_EVICTED, "cleared": KIND.KIND_CLEARED}


@dataclass
class Seq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    cache_salt: str = "m"


def batch(*events: tuple[str, list[int]]) -> engine_pb2.KvEventBatch:
    return engine_pb2.KvEventBatch(
        sequence=1,
        engine_id="e",
        events=[engine_pb2.KvEvent(kind=KINDS[k], block_hashes=h) for k, h in events],
    )


def test_index_mirrors_the_engine_cache_through_evictions():
    emitted: list[tuple[str, list[int]]] = []
    engine = BlockManager(12, 4, on_event=lambda k, h: emitted.append((k, list(h))))
    index, history = PrefixIndex(), PickHistory(60, 1000)
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(16)] for _ in range(5)]
    evictions = 0
    for _ in range(300):
        seq = Seq(rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(9))])
        engine.allocate(seq)
        engine.mark_computed(seq, len(seq.token_ids))
        engine.free(seq)
        evictions += sum(kind == "evicted" for kind, _ in emitted)
        apply_batch(index, history, endpoint("e"), batch(*emitted))
        emitted.clear()
        cached = set(engine.hash_to_block)
        assert index.size("e") == len(cached)
        assert all(index.holds("e", h) for h in cached)
    assert evictions > 20  # the cache really was too small for the workload


def test_an_evicted_block_stops_counting_and_ends_the_run():
    tokens = list(range(64))
    hashes = blocks(tokens)
    index = PrefixIndex()
    history = PickHistory(60, 1000)
    scorer = PrefixScorer(index, history)
    e = endpoint("e")
    apply_batch(index, history, endpoint("e"), batch(("stored", hashes)))
    assert scorer.score(context(tokens), [e]) == [1.0]
    apply_batch(index, history, endpoint("e"), batch(("evicted", [hashes[1]])))
    # Blocks 2 and 3 are still cached, but without block 1 they are no prefix.
    assert scorer.score(context(tokens), [e]) == [0.25]


def test_an_eviction_also_overrides_the_routing_history_guess():
    tokens = list(range(32))
    hashes = blocks(tokens)
    index, history = PrefixIndex(), PickHistory(60, 1000)
    history.record("e", hashes, now=100.0)
    apply_batch(index, history, endpoint("e"), batch(("evicted", hashes[:1])))
    assert PrefixScorer(index, history).score(context(tokens), [endpoint("e")]) == [0.0]


def test_a_snapshot_replaces_everything_known_before():
    index, history = PrefixIndex(), PickHistory(60, 1000)
    apply_batch(index, history, endpoint("e"), batch(("stored", [1, 2, 3])))
    apply_batch(index, history, endpoint("e"), batch(("cleared", []), ("stored", [3, 4])))
    assert [index.holds("e", h) for h in (1, 2, 3, 4)] == [False, False, True, True]


def test_endpoints_are_indexed_apart():
    index, history = PrefixIndex(), PickHistory(60, 1000)
    apply_batch(index, history, endpoint("a"), batch(("stored", [1])))
    apply_batch(index, history, endpoint("b"), batch(("cleared", [])))
    assert index.holds("a", 1) and not index.holds("b", 1)
