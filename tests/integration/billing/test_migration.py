"""An older release's Redis ledger moves into the database at start, and answers the same.

The old layout is written with the commands the old ledger script ran for
each event (HINCRBY of the running totals and the hour and day buckets, ZADD
of the line item, SADD of the dedup mark, the month counter); the new billing
then starts on that Redis.
"""

import asyncio
import json
import time
import uuid

import pytest

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.ledger import DAY, HOUR, PREFIX, bucket_start
from maas_services.common.billing_keys import month_key, tenant_key
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from tests.integration.billing.stopping import stopped

PRICES = PriceTable(models={"m": ModelPrice(input="1", output="2")})


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


async def old_apply(redis, event: UsageEvent) -> None:
    """What the previous release's ledger script wrote for one event."""
    cost = PRICES.for_deployment(event.served_by).cost_nano_usd(
        event.prompt_tokens, event.cached_prompt_tokens, event.completion_tokens
    )
    finished = event.started_at + event.duration_seconds
    hour, day = bucket_start(finished, HOUR), bucket_start(finished, DAY)
    t = event.tenant
    values = {
        "requests": 1,
        "prompt_tokens": event.prompt_tokens,
        "cached_prompt_tokens": event.cached_prompt_tokens,
        "completion_tokens": event.completion_tokens,
        "cost_nano_usd": cost,
    }
    for key in (tenant_key(t), tenant_key(t, f":hour:{hour}"), tenant_key(t, f":day:{day}")):
        for field, value in values.items():
            await redis.hincrby(key, field, value)
            await redis.hincrby(key, f"model:{event.model}:{field}", value)
    item = {
        "request_id": event.request_id,
        "model": event.model,
        "deployment": event.served_by,
        "key_id": event.key_id,
        "time": event.started_at,
        "prompt_tokens": event.prompt_tokens,
        "cached_prompt_tokens": event.cached_prompt_tokens,
        "completion_tokens": event.completion_tokens,
        "cost_nano_usd": cost,
    }
    await redis.zadd(tenant_key(t, ":items"), {json.dumps(item, sort_keys=True): event.started_at})
    await redis.sadd(f"{PREFIX}seen:{bucket_start(event.started_at, HOUR)}", event.request_id)
    await redis.hincrby(
        month_key(t, finished), "tokens", event.prompt_tokens + event.completion_tokens
    )


async def old_buckets(redis, tenant: str, start: int, end: int, size: int) -> list[tuple]:
    """The previous release's bucket API: the hashes, read as it read them."""
    suffix = "hour" if size == HOUR else "day"
    out = []
    for s in range(bucket_start(start, size), end, size):
        raw = await redis.hgetall(tenant_key(tenant, f":{suffix}:{s}"))
        if raw:
            out.append(
                (s, int(raw["requests"]), int(raw["prompt_tokens"]), int(raw["cost_nano_usd"]))
            )
    return out


async def new_buckets(consumer, tenant: str, start: int, end: int, size: int) -> list[tuple]:
    buckets = await consumer.ledger.buckets(tenant, start, end, size)
    return [(s, t.requests, t.prompt_tokens, t.cost_nano_usd) for s, t in buckets]


async def test_old_line_items_and_buckets_move_to_the_database_and_answer_the_same(redis, store):
    tenant = f"old-{uuid.uuid4().hex[:6]}"
    now = time.time()
    base = bucket_start(now, DAY) - 2 * DAY
    old_events = [
        UsageEvent(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            tenant=tenant,
            model="m",
            prompt_tokens=100 + i,
            completion_tokens=10,
            started_at=base + i * 1800 + 5,  # over a day of hours, two days ago
        )
        for i in range(60)
    ]
    for e in old_events:
        await old_apply(redis, e)
    start, end = int(base), int(now) + 1
    before = {size: await old_buckets(redis, tenant, start, end, size) for size in (HOUR, DAY)}
    totals_before = await redis.hgetall(tenant_key(tenant))
    group = f"g-{uuid.uuid4().hex[:6]}"
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    consumer = UsageConsumer(redis, group, "c0", batch=50, block_ms=50, prices=PRICES, store=store)
    task = asyncio.create_task(consumer.run())
    try:
        # The old keys go, the running totals and month counter stay; the dedup
        # marks go last (migration deletes them after the tenants' keys).
        stay = {tenant_key(tenant), month_key(tenant, old_events[-1].started_at)}
        async with asyncio.timeout(30):
            while set(await redis.keys(f"{PREFIX}tenant:{tenant}*")) != stay or (
                await redis.keys(f"{PREFIX}seen:*")
            ):
                await asyncio.sleep(0.05)
        for size in (HOUR, DAY):
            assert await new_buckets(consumer, tenant, start, end, size) == before[size]
        assert await redis.hgetall(tenant_key(tenant)) == totals_before
        items = await consumer.ledger.line_items(tenant, 0, end, 0, 1000)
        assert [i["request_id"] for i in items] == [e.request_id for e in old_events]
        # A replay of a migrated request is a duplicate; a new one adds on top.
        fresh = old_events[0].model_copy(update={"request_id": "new", "started_at": now})
        for e in (old_events[0], fresh):
            await redis.xadd(USAGE_STREAM, e.to_fields())
        async with asyncio.timeout(30):
            while (await consumer.ledger.totals(tenant))[0].requests < 61:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert (await consumer.ledger.totals(tenant))[0].requests == 61
    finally:
        await stopped(task)
