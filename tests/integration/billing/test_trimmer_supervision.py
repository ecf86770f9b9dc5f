"""The usage-stream trimmer outlives a round that fails with an error that is not
Redis's: it is counted, retried, and the stream is trimmed afterwards, on a real
Redis. The failure is a reply the trimmer cannot read, given once by a Redis
client subclass (the boundary), since a real server never sends one."""

import asyncio
import uuid

from prometheus_client import REGISTRY
from redis.asyncio import Redis

from maas_services.billing.retention import StreamTrimmer
from tests.integration.billing.stopping import stopped

RESTARTS = "maas_billing_trimmer_restarts_total"


class GarbledOnce(Redis):
    """A real client whose first XINFO GROUPS reply has an id that is no stream id."""

    garbled = False

    async def xinfo_groups(self, name):
        groups = await super().xinfo_groups(name)
        if not self.garbled:
            self.garbled = True
            return [{**group, "last-delivered-id": "not-an-id"} for group in groups]
        return groups


async def acked_entries(redis: Redis, stream: str, count: int) -> None:
    ids = [await redis.xadd(stream, {"n": str(i)}) for i in range(count)]
    await redis.xreadgroup("billing", "c0", {stream: ">"})
    await redis.xack(stream, "billing", *ids)


async def trimmed(redis: Redis, stream: str) -> None:
    # A hang guard, not a timing claim: a dead trimmer never trims.
    async with asyncio.timeout(30):
        while await redis.xlen(stream):
            await asyncio.sleep(0.05)


async def test_a_failed_round_is_retried_and_the_trimmer_trims_afterwards(redis_url):
    redis = GarbledOnce.from_url(redis_url, decode_responses=True)
    # A stream of this test's own: the trimmer honours every group of its stream.
    stream = f"test:usage:{uuid.uuid4().hex}"
    before = REGISTRY.get_sample_value(RESTARTS, {"error": "ValueError"}) or 0
    await redis.xgroup_create(stream, "billing", id="0", mkstream=True)
    await acked_entries(redis, stream, 3)
    task = asyncio.create_task(StreamTrimmer(redis, stream, interval_seconds=0.05).run())
    try:
        await trimmed(redis, stream)
        assert redis.garbled
        assert REGISTRY.get_sample_value(RESTARTS, {"error": "ValueError"}) == before + 1
        # Still running: later entries are trimmed too.
        await acked_entries(redis, stream, 2)
        await trimmed(redis, stream)
        assert not task.done()
    finally:
        await stopped(task)
        await asyncio.gather(task, return_exceptions=True)
        await redis.delete(stream)
        await redis.aclose()
    assert task.cancelled()
