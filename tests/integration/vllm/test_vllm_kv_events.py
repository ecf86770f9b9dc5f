"""vLLM's KV events, translated by the adapter, make a real router's prefix index exact."""

import pytest

from maas.v1 import router_pb2
from maas_services.common.block_hash import prefix_block_hashes, request_salt
from tests.integration.router.conftest import Cluster, eventually
from tests.integration.vllm.conftest import BLOCK_SIZE, MODEL_ID, generate_request

pytestmark = pytest.mark.slow

# Four full blocks no other test sends.
PREFIX = list(range(2000, 2000 + 4 * BLOCK_SIZE))


def hashes_for(tenant: str) -> list[int]:
    return prefix_block_hashes(PREFIX, BLOCK_SIZE, request_salt(MODEL_ID, "tenant", tenant, False))


async def pick(router, tokens: list[int], tenant: str, request_id: str) -> str:
    reply = await router.stub.Pick(
        router_pb2.PickRequest(
            request_id=request_id, model=MODEL_ID, token_ids=tokens, tenant=tenant
        )
    )
    await router.stub.Release(router_pb2.ReleaseRequest(request_id=request_id))
    return reply.endpoint_id


async def test_router_finds_the_prefix_vllm_holds(adapter, stub):
    cluster = Cluster()
    try:
        # An idle replica that holds nothing: only the index can send picks to vLLM.
        other = await cluster.engine("other", model=MODEL_ID)
        router = await cluster.router(engines=[f"vllm={adapter}", f"other={other.address}"])
        await eventually(
            lambda: any(
                e.endpoint_id == "vllm" and e.kv_events_live
                for e in router.pool.for_model(MODEL_ID)
            ),
            what="the adapter's event stream",
        )
        responses = [
            r
            async for r in stub.Generate(
                generate_request("kv", prompt=PREFIX, tenant="kv", max_tokens=1)
            )
        ]
        assert responses[-1].finish_reason
        ours = hashes_for("kv")
        await eventually(
            lambda: all(router.pool.index.holds("vllm", h) for h in ours), what="indexed blocks"
        )
        assert not any(router.pool.index.holds("vllm", h) for h in hashes_for("someone-else"))
        for i in range(3):
            assert await pick(router, [*PREFIX, 7, 8, 9], "kv", f"p{i}") == "vllm"
    finally:
        await cluster.close()
