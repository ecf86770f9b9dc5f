"""Prefix affinity per tenant: a router fed by engines' KV events finds a tenant's
own cached prefix and none of another tenant's, unless the engine shares."""

import random

from maas_services.common.block_hash import prefix_block_hashes, request_salt
from tests.integration.router.conftest import eventually

PROMPT = [random.Random(11).randrange(49152) for _ in range(160)]


def cached(tenant: str, sharing: str = "tenant", share: bool = False) -> list[int]:
    """What an engine (block 16, salted with the model id) stores for this request."""
    return prefix_block_hashes(PROMPT, 16, request_salt("m", sharing, tenant, share))


async def busy_holder(cluster, sharing: str = "tenant"):
    """Four replicas; e2 is the busiest, so only prefix affinity sends anything there."""
    engines = [await cluster.engine(f"e{i}") for i in range(4)]
    engines[2].load.running, engines[2].load.waiting = 2, 1
    engines[2].load.prefix_cache_sharing = sharing
    router = await cluster.router()
    await eventually(
        lambda: (
            router.pool.endpoints["e2"].waiting == 1
            and router.pool.endpoints["e2"].prefix_cache_sharing == sharing
        ),
        what="e2's load polled",
    )
    return engines[2], router


async def test_a_tenant_finds_its_own_prefix_and_not_another_tenants(cluster):
    holder, router = await busy_holder(cluster)
    holder.store(cached("a"))
    await eventually(lambda: router.pool.index.size("e2"), what="e2's blocks indexed")

    assert await router.pick(PROMPT + [7], tenant="a") == "e2"
    # Another tenant, or one asking to share with an engine that does not.
    assert await router.pick(PROMPT + [7], tenant="b") != "e2"
    assert await router.pick(PROMPT + [7], tenant="b", share_prefix_cache=True) != "e2"


async def test_an_engine_that_shares_gives_affinity_to_requests_that_ask(cluster):
    holder, router = await busy_holder(cluster, sharing="global")
    holder.store(cached("a", "global", share=True))
    await eventually(lambda: router.pool.index.size("e2"), what="e2's blocks indexed")

    assert await router.pick(PROMPT + [7], tenant="b", share_prefix_cache=True) == "e2"
    assert await router.pick(PROMPT + [7], tenant="b") != "e2"
