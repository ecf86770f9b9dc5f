"""A request naming a LoRA adapter goes where the adapter is loaded, else where
there is room to load it, never to a replica that serves no adapters; a burst
for a new adapter loads it on few replicas; its prefix blocks are its own.

The last tests run the router's scheduler over simulated engines
(benchmarks/lora_affinity_bench.py) for the worst case: one tenant's requests
over 100 distinct adapters, beside another's few hot ones.
"""

import random
from collections import Counter

import grpc
import pytest

from benchmarks.lora_affinity_bench import Arrival, simulate
from maas.v1 import router_pb2
from maas_services.common.block_hash import BLOCK_SIZE, prefix_block_hashes, request_salt
from tests.integration.router.conftest import TENANT, eventually

PROMPT = list(range(500, 600))


async def pick(router, adapter: str, tokens=PROMPT, policy_model: str = "m") -> str:
    reply = await router.stub.Pick(
        router_pb2.PickRequest(
            request_id=f"r{random.random()}",
            model=policy_model,
            token_ids=tokens,
            tenant=TENANT,
            adapter=adapter,
        )
    )
    return reply.endpoint_id


async def engines(cluster, **adapters_of: tuple[int, list[str]]) -> None:
    """Fake engines by id: (max_loras, adapters loaded)."""
    for engine_id, (max_loras, loaded) in adapters_of.items():
        engine = await cluster.engine(engine_id)
        engine.load.max_loras = max_loras
        engine.load.adapters[:] = loaded


async def known(router, count: int) -> None:
    await eventually(
        lambda: (
            len(router.pool.endpoints) == count
            and all(e.ready for e in router.pool.endpoints.values())
        ),
        what="every engine reachable",
    )


async def test_a_replica_holding_the_adapter_wins_over_a_less_loaded_one(cluster):
    await engines(cluster, holder=(4, ["sql"]), idle=(4, []))
    cluster.engines[0].load.running = 2  # 8 with the picks: within the overload margin
    router = await cluster.router()
    await known(router, 2)
    assert {await pick(router, "sql") for _ in range(6)} == {"holder"}
    # A base request has no preference: load decides.
    assert await pick(router, "") == "idle"


async def test_room_comes_next_and_a_full_replica_last(cluster):
    await engines(
        cluster,
        full=(2, ["a", "b"]),
        room=(2, ["a"]),
        empty_but_busy=(0, []),
        other=(2, ["c", "d"]),
    )
    router = await cluster.router()
    await known(router, 4)
    assert await pick(router, "new") == "room"
    assert await pick(router, "b") == "full"


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix_affinity"])
async def test_a_replica_serving_no_adapters_never_gets_an_adapter_request(cluster, policy):
    await engines(cluster, plain=(0, []), lora=(4, []))
    cluster.engines[1].load.running = 3
    router = await cluster.router(routing_policy=policy)
    await known(router, 2)
    assert {await pick(router, "sql") for _ in range(8)} == {"lora"}
    assert "plain" in {await pick(router, "") for _ in range(8)}


async def test_no_replica_serving_adapters_is_unavailable(cluster):
    await engines(cluster, plain=(0, []))
    router = await cluster.router()
    await known(router, 1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await pick(router, "sql")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_burst_for_a_new_adapter_loads_it_on_few_replicas(cluster):
    await engines(cluster, **{f"e{i}": (4, []) for i in range(4)})
    # No load report during the burst: only the router's own picks say where it went.
    router = await cluster.router(poll_interval_seconds=60, overload_margin=8)
    await known(router, 4)
    chosen = Counter([await pick(router, "fresh", tokens=[i, i + 1]) for i in range(16)])
    # One replica takes it up to the overload guard (9 = least + margin + 1), then one more.
    assert sorted(chosen.values()) == [7, 9]
    first = chosen.most_common(1)[0][0]
    endpoint = router.pool.endpoints[first]
    assert "fresh" in endpoint.loaded_adapters and "fresh" not in endpoint.adapters
    # The next report settles it: the engine never loaded it, so it no longer counts.
    await router.pool._links[first].poll_once()
    assert "fresh" not in endpoint.loaded_adapters
    # A report that has it keeps it.
    cluster.engines[int(first[1:])].load.adapters[:] = ["fresh"]
    await router.pool._links[first].poll_once()
    assert "fresh" in endpoint.loaded_adapters


async def test_an_adapters_prefix_blocks_are_its_own(cluster):
    await engines(cluster, adapter_cache=(4, ["sql"]), base_cache=(4, ["sql"]))
    salt = "m"  # the engines report no cache salt: the model's name

    def hashes(adapter: str) -> list[int]:
        return prefix_block_hashes(
            PROMPT, BLOCK_SIZE, request_salt(salt, "tenant", TENANT, False, adapter)
        )

    cluster.engines[0].store(hashes("sql"))
    cluster.engines[1].store(hashes(""))
    router = await cluster.router()
    await known(router, 2)
    await eventually(
        lambda: all(e.kv_events_live for e in router.pool.endpoints.values()), what="events"
    )
    assert await pick(router, "sql") == "adapter_cache"
    assert await pick(router, "") == "base_cache"


async def test_pool_stats_say_where_adapters_are(cluster):
    await engines(cluster, a=(4, ["sql", "chat"]), b=(2, ["chat"]), c=(0, []))
    router = await cluster.router()
    await known(router, 3)
    stats = await router.stats()
    assert list(stats.adapters) == ["chat", "sql"]
    replicas = {r.endpoint_id: (list(r.adapters), r.max_loras) for r in stats.replicas}
    assert replicas == {"a": (["chat", "sql"], 4), "b": (["chat"], 2), "c": ([], 0)}


# The worst case: tenant "acme" sends steady traffic over 4 hot adapters while
# tenant "flood" sends one request each over 100 distinct adapters, from 10 s
# on, at a rate the pool can take (10/s) or in a rush (50/s). Engines hold 8
# adapters each (least recently used evicted first), 4 in one batch.
HOT = [f"hot-{i}" for i in range(4)]
FLOOD_STARTS = 10.0


def flood_workload(flood_rate: float) -> list[Arrival]:
    rng = random.Random(3)
    arrivals, at = [], 0.0
    while at < 30.0:
        at += rng.expovariate(8.0)
        arrivals.append(Arrival(at, rng.choice(HOT), "acme"))
    at = FLOOD_STARTS
    for i in range(100):
        at += rng.expovariate(flood_rate)
        arrivals.append(Arrival(at, f"cold-{i:03d}", "flood"))
    return sorted(arrivals, key=lambda a: a.at)


def hot_evictions(served) -> int:
    return sum(name in HOT for s in served if s.arrival.tenant == "flood" for name in s.evicted)


def hot_loads_during_flood(served) -> int:
    return sum(
        s.loaded for s in served if s.arrival.adapter in HOT and s.arrival.at >= FLOOD_STARTS
    )


@pytest.mark.parametrize("flood_rate", [10.0, 50.0])
def test_a_flood_of_distinct_adapters_evicts_each_hot_adapter_at_most_once(flood_rate):
    arrivals = flood_workload(flood_rate)
    affinity = simulate("prefix_affinity", arrivals)
    round_robin = simulate("round_robin", arrivals)
    # Load balance still spreads the flood: no replica takes more than its share
    # by more than the overload margin (8).
    flood = Counter(s.replica for s in affinity if s.arrival.tenant == "flood")
    assert max(flood.values()) - min(flood.values()) <= 8
    # The hot adapters' placement survives it: each is evicted at most once
    # (where the rush leaves no replica an idle slot to give), never churned.
    assert hot_evictions(affinity) <= len(HOT)
    assert hot_evictions(affinity) < hot_evictions(round_robin)
    assert hot_loads_during_flood(affinity) < hot_loads_during_flood(round_robin)
