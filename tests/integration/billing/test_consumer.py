"""The billing consumer against a real Redis: exact, idempotent, crash-safe."""

import asyncio
import time
import uuid

import pytest

from maas_services.billing.consumer import UsageConsumer
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent


def event(
    tenant: str, prompt: int, completion: int, when: float | None = None, cached: int = 0
) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        started_at=time.time() if when is None else when,
    )


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


PRICES = PriceTable(models={"m": ModelPrice(input="0.15", cached_input="0.075", output="0.6")})


def consumer(redis, group: str, name: str = "c0", claim_idle_ms: int = 30_000) -> UsageConsumer:
    return UsageConsumer(
        redis, group, name, batch=50, block_ms=100, prices=PRICES, claim_idle_ms=claim_idle_ms
    )


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
    totals, models = await c.ledger.totals(tenant)
    assert totals.requests == 50
    assert totals.prompt_tokens == sum(e.prompt_tokens for e in events)
    assert totals.completion_tokens == sum(e.completion_tokens for e in events)
    assert models["m"] == totals
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
    totals, _ = await c.ledger.totals(tenant)
    assert totals.requests == 5
    assert totals.completion_tokens == 20


async def test_malformed_entry_is_rejected_without_blocking_others(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    await redis.xadd(USAGE_STREAM, {"request_id": "x", "tenant": tenant, "prompt_tokens": "-5"})
    good = event(tenant, 1, 2)
    await redis.xadd(USAGE_STREAM, good.to_fields())
    c = consumer(redis, group)
    await run_briefly(c)
    assert (await c.ledger.totals(tenant))[0].completion_tokens == 2
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0


async def test_buckets_line_items_and_exact_cost(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    # Two days ago: inside the dedup window and every retention (ledger.py).
    day = int(time.time()) // 86400 * 86400 - 2 * 86400
    events = [
        event(tenant, 1000, 100, when=day + 10),  # hour 0
        event(tenant, 2000, 50, when=day + 3600 + 5, cached=1500),  # hour 1
        event(tenant, 10, 1, when=day + 86400 + 1),  # next day
    ]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    c = consumer(redis, group)
    await run_briefly(c)
    hours = await c.ledger.buckets(tenant, day, day + 2 * 86400, 3600)
    assert [(s - day, t.requests) for s, t in hours] == [(0, 1), (3600, 1), (86400, 1)]
    days = await c.ledger.buckets(tenant, day, day + 2 * 86400, 86400)
    assert [(s - day, t.prompt_tokens) for s, t in days] == [(0, 3000), (86400, 10)]
    totals, _ = await c.ledger.totals(tenant)
    # 0.15 $/M input, 0.075 $/M cached, 0.6 $/M output, in nano-USD (x1000 per token).
    expected = (1000 * 150 + 100 * 600) + (500 * 150 + 1500 * 75 + 50 * 600) + (10 * 150 + 600)
    assert totals.cost_nano_usd == expected
    items = await c.ledger.line_items(tenant, day, day + 86400, offset=0, limit=10)
    assert [i["request_id"] for i in items] == [events[0].request_id, events[1].request_id]
    assert sum(i["cost_nano_usd"] for i in items) + 10 * 150 + 600 == expected


async def test_entries_left_by_a_dead_consumer_are_claimed(redis):
    tenant, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    live = consumer(redis, group, name="alive", claim_idle_ms=200)
    await live.ensure_group()
    events = [event(tenant, 5, 5) for _ in range(7)]
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    # "dead" read everything and vanished without acking.
    await redis.xreadgroup(group, "dead", {USAGE_STREAM: ">"}, count=10_000)
    await asyncio.sleep(0.3)
    await run_briefly(live, 1.0)
    assert (await live.ledger.totals(tenant))[0].requests == 7
    assert (await redis.xpending(USAGE_STREAM, group))["pending"] == 0
