"""Routers fed by engines' KV event streams: precise, shared, rebuilt, and robust to loss."""

import random

import grpc
import pytest

from maas_services.common.block_hash import prefix_block_hashes, request_salt
from tests.integration.router.conftest import TENANT, eventually


def prompt(group: int, extra: int = 0, length: int = 160) -> list[int]:
    """A prompt of `length` tokens shared by `group`, then `extra` tokens of its own."""
    rng = random.Random(group)
    return [rng.randrange(49152) for _ in range(length)] + list(range(1000, 1000 + extra))


def hashes(tokens: list[int], tenant: str = TENANT) -> list[int]:
    # The fake engines report no block size or salt: block 16, salted with the
    # model id and, as they share nothing across tenants, the tenant.
    return prefix_block_hashes(tokens, 16, request_salt("m", "tenant", tenant, False))


def indexed(router, engine_id: str) -> int:
    return router.pool.index.size(engine_id)


async def test_pick_follows_stored_blocks_and_stops_at_an_eviction(cluster):
    engines = [await cluster.engine(f"e{i}") for i in range(4)]
    router = await cluster.router()
    engines[2].store(hashes(prompt(1)))
    await eventually(lambda: indexed(router, "e2"), what="e2's blocks indexed")
    assert await router.pick(prompt(1, extra=40)) == "e2"

    engines[2].evict(hashes(prompt(1))[:1])
    engines[3].store(hashes(prompt(1)))
    await eventually(lambda: indexed(router, "e3"), what="e3's blocks indexed")
    assert await router.pick(prompt(1, extra=7)) == "e3"


async def test_two_routers_pick_alike_and_a_restarted_one_rebuilds_its_index(cluster):
    engines = [await cluster.engine(f"e{i}") for i in range(4)]
    # No load polls during the picks: each router counts its own picks as load
    # until the next poll, and polls landing between one router's pick and the
    # other's would make them see different loads.
    first = await cluster.router(poll_interval_seconds=60)
    for group, engine in enumerate(engines):
        engine.store(hashes(prompt(group)))
    engines[0].store(hashes(prompt(9)))
    # Started after the events: everything it knows comes from the snapshot.
    second = await cluster.router(poll_interval_seconds=60)
    for router in (first, second):
        for engine in engines:
            want = len(engine.cached)
            await eventually(
                lambda r=router, e=engine, n=want: indexed(r, e.engine_id) == n,
                what=f"{engine.engine_id} indexed",
            )

    rng = random.Random(3)
    for i in range(40):
        tokens = prompt(rng.randrange(12), extra=rng.randrange(60))
        session = f"user{rng.randrange(5)}" if i % 2 else ""
        a = await first.pick(tokens, session=session)
        b = await second.pick(tokens, session=session)
        assert a == b, f"pick {i} differs: {a} vs {b}"
        if tokens[:160] == prompt(1):
            assert a == "e1"

    await first.close()
    restarted = await cluster.router()
    await eventually(lambda: indexed(restarted, "e0") == len(engines[0].cached))
    assert await restarted.pick(prompt(9, extra=3)) == "e0"


async def test_a_killed_replica_is_removed_at_once_and_back_when_it_returns(cluster):
    engines = [await cluster.engine(f"e{i}") for i in range(3)]
    router = await cluster.router(poll_interval_seconds=5.0)  # the event stream must notice
    engines[1].store(hashes(prompt(4)))
    await eventually(lambda: indexed(router, "e1"))
    assert await router.pick(prompt(4)) == "e1"

    await engines[1].stop()

    async def e1_out():
        stats = await router.stats()
        return not next(r.ready for r in stats.replicas if r.endpoint_id == "e1")

    await eventually(e1_out, timeout=2.0, what="e1 marked down")
    assert (await router.stats()).ready_replicas == 2
    assert {await router.pick(prompt(4, extra=i)) for i in range(10)} <= {"e0", "e2"}

    engines[1].cached.clear()
    await engines[1].start()  # same port: the same replica, restarted with an empty cache
    await eventually(lambda: router.pool.endpoints["e1"].available, timeout=12.0)
    assert indexed(router, "e1") == 0


async def test_exclusions_and_draining_replicas_get_no_requests(cluster):
    engines = [await cluster.engine(f"e{i}") for i in range(3)]
    router = await cluster.router()
    engines[0].store(hashes(prompt(5)))
    await eventually(lambda: indexed(router, "e0"))
    # A gateway retrying after e0 failed this request.
    assert await router.pick(prompt(5), exclude=["e0"]) != "e0"

    engines[0].load.draining = True
    await eventually(lambda: router.pool.endpoints["e0"].draining)
    assert "e0" not in {await router.pick(prompt(5, extra=i)) for i in range(10)}

    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await router.pick(prompt(5), exclude=["e1", "e2"])
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_without_events_routing_history_keeps_a_prefix_together(cluster):
    for i in range(4):
        await cluster.engine(f"e{i}", events=False)
    router = await cluster.router()
    for group in range(6):
        first = await router.pick(prompt(group, extra=1))
        assert {await router.pick(prompt(group, extra=n)) for n in range(2, 6)} == {first}
    stats = await router.stats()
    assert not any(r.kv_events_live for r in stats.replicas)


async def test_pool_stats_sum_ready_replicas(cluster):
    engines = [await cluster.engine(f"e{i}") for i in range(3)]
    engines[0].load.running, engines[0].load.waiting = 3, 2
    engines[1].load.running, engines[1].load.kv_cache_usage = 1, 0.5
    engines[2].load.draining = True
    router = await cluster.router(routing_policy="least_load")
    await eventually(lambda: router.pool.endpoints["e2"].draining)
    stats = await router.stats()
    assert stats.routing_policy == "least_load"
    assert stats.ready_replicas == 2
    assert (stats.running, stats.queue_depth, stats.capacity) == (4, 2, 16)
    assert stats.kv_cache_usage == pytest.approx(0.25)
    assert [r.endpoint_id for r in stats.replicas] == ["e0", "e1", "e2"]
    assert [r.draining for r in stats.replicas] == [False, False, True]
    assert all(r.kv_events_live and r.kv_cache_blocks == 64 for r in stats.replicas)
