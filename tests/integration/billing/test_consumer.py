"""The billing consumer against a real Redis: exact, idempotent, crash-safe."""

import asyncio
import time
import uuid

import pytest

from services.billing.consumer import UsageConsumer
from services.common.redis_client import open_redis
from services.common.usage_event import USAGE_STREAM, UsageEvent


def event(tenant: str, prompt: int, completion: int, request_id: str | None = None) -> UsageEvent:
    return UsageEvent(
        request_id=request_id or uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=prompt,
        completion_tokens=completion,
        started_at=time.time(),
    )


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


def consumer(redis, group: str, name: str = "c0") -> UsageConsumer:
    return UsageConsumer(redis, group, name, batch=50, block_ms=100)


async def run_briefly(c: UsageConsumer, seconds: float = 0.5) -> None:
    task = asyncio.create_task(c.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_counts_exactly_and_ignores_duplicate_deliveries(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    events = [event(tenant, 10 + i, i) for i in range(50)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # The same request published twice (a gateway retry) counts once.
    await redis.xadd(USAGE_STREAM, events[0].to_fields())
    c = consumer(redis, group)
    await run_briefly(c)
    totals = await c.counters.read(tenant)
    assert totals["requests"] == 50
    assert totals["prompt_tokens"] == sum(e.prompt_tokens for e in events)
    assert totals["completion_tokens"] == sum(e.completion_tokens for e in events)
    pending = await redis.xpending(USAGE_STREAM, group)
    assert pending["pending"] == 0


async def test_entries_delivered_before_a_crash_are_applied_on_restart(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    c = consumer(redis, group)
    await c.ensure_group()
    events = [event(tenant, 3, 4) for _ in range(5)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # A consumer that read the entries and died before processing them.
    delivered = await redis.xreadgroup(group, "c0", {USAGE_STREAM: ">"}, count=100)
    assert len(delivered[0][1]) >= 5
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] >= 5
    # The restarted consumer (same name) re-reads its pending entries first.
    await run_briefly(consumer(redis, group))
    totals = await c.counters.read(tenant)
    assert totals["requests"] == 5
    assert totals["completion_tokens"] == 20


async def test_malformed_entry_is_rejected_without_blocking_others(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    await redis.xadd(USAGE_STREAM, {"request_id": "x", "tenant": tenant, "prompt_tokens": "-5"})
    good = event(tenant, 1, 2)
    await redis.xadd(USAGE_STREAM, good.to_fields())
    c = consumer(redis, group)
    await run_briefly(c)
    assert (await c.counters.read(tenant))["completion_tokens"] == 2
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0
