"""The prepaid balance's reservations under the Redis ACL users, on both servers.

Billing publishes its price table and drops a request's hold as it charges it;
the gateway reads the prices and reserves, settles and releases holds. Each
runs as its own user through the real code, with the rules in
maas_services.common.redis_acl (test_redis_acl.py covers the rest of each user).
"""

import asyncio
import time
import uuid
from decimal import Decimal

from maas_services.billing.consumer import UsageConsumer
from maas_services.common.balance_reservations import reservation_keys
from maas_services.common.prices import PRICES_KEY, ModelPrice, PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.admission.quota_gate import QuotaGate
from maas_services.gateway.usage.usage_emitter import UsageEmitter
from maas_services.gateway.usage.usage_spool import UsageSpool
from tests.integration.local.test_redis_acl import clients, new_tenant, server  # noqa: F401

PRICE = ModelPrice(input=Decimal(1), output=Decimal(2))


async def consume_until(consumer: UsageConsumer, done) -> None:
    task = asyncio.create_task(consumer.run())
    try:
        deadline = time.monotonic() + 30
        while not await done():
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_billing_and_the_gateway_move_a_prepaid_hold(clients, tmp_path):  # noqa: F811
    gateway, billing, admin = clients["gateway"], clients["billing"], clients["admin"]
    name, key_id, _ = await new_tenant(admin)
    await Quotas(admin).top_up(name, 10**9)
    table = PriceTable(models={"m": PRICE})
    consumer = UsageConsumer(
        billing, f"g-{uuid.uuid4().hex[:6]}", "acl", batch=100, block_ms=50, prices=table
    )

    async def published() -> bool:
        return await gateway.get(PRICES_KEY) == table.model_dump_json()

    await consume_until(consumer, published)

    gate = QuotaGate(gateway, "fail_closed")
    costs = reservation_keys(name)[1]
    served = gate.reservation(name, "r-served")
    await served.take("m", 7, 3)
    failed = gate.reservation(name, "r-failed")
    await failed.take("m", 7, 3)
    assert await admin.hgetall(costs) == {"r-served": "13000", "r-failed": "13000"}
    await failed.release()
    event = UsageEvent(
        request_id="r-served",
        tenant=name,
        key_id=key_id,
        model="m",
        deployment="m",
        prompt_tokens=7,
        completion_tokens=1,
        started_at=time.time(),
    )
    spool = UsageSpool.open(tmp_path / "spool")
    try:
        await UsageEmitter(gateway, spool).emit(event, served.settlement(event))
        assert len(spool) == 0
    finally:
        spool.close()
    assert await admin.hgetall(costs) == {"r-served": "9000"}  # settled to its real cost

    async def charged() -> bool:
        return await admin.hgetall(costs) == {}

    await consume_until(consumer, charged)
    assert (await Quotas(admin).state(name)).balance_nano_usd == 10**9 - 9000
