"""A request's owed work (usage event, TPM settlement) waits for its last byte."""

import asyncio
import uuid

from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM
from maas_services.gateway.admission.tenants import Tenant


async def owed(cluster, redis, tenant: Tenant, request_id: str) -> tuple:
    """(usage events, tokens still reserved) for the request."""
    await asyncio.sleep(0.05)  # time for work that was not held back to run
    # The session's Redis is shared: other tests write other (and malformed) entries.
    entries = await redis.xrange(USAGE_STREAM)
    events = [f for _, f in entries if f.get("request_id") == request_id]
    reserved = await redis.hget(f"maas:rl:{{{tenant.name}}}:tokens", request_id)
    return len(events), int(reserved or 0)


async def test_usage_and_settlement_wait_until_the_front_has_delivered(make_cluster, redis_url):
    cluster = await make_cluster(replicas=1)
    tenant = Tenant(name=f"after-{uuid.uuid4().hex[:8]}", tpm=10**9)
    completion = await cluster.complete(tenant, max_tokens=8)
    request_id = completion.ticket.request.request_id
    redis = open_redis(redis_url)
    try:
        assert [d async for d in completion.deltas]
        events, reserved = await owed(cluster, redis, tenant, request_id)
        # The engine stream is over, but the response is not out yet.
        assert events == 0 and reserved == 3 + 8
        await completion.close()
        await cluster.pipeline.background.wait()
        events, reserved = await owed(cluster, redis, tenant, request_id)
    finally:
        await redis.aclose()
    # Settled to the 3 prompt and 3 completion tokens really used.
    assert (events, reserved) == (1, 6)
    # Nothing is owed to the router: its pick ends at the engine's next load report.
    assert cluster.router.releases == []
