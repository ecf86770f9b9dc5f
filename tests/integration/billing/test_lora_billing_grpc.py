"""The Billing gRPC service reports LoRA adapters: each line item's `adapter`, and
GetUsage's `adapters` (totals per adapter, ranged queries included), billed by the real
consumer on real Redis and each database."""

import time
import uuid

from maas.v1 import billing_pb2
from tests.integration.billing.test_alias_pricing import bill, billing, line_items, redis  # noqa: F401
from tests.integration.billing.test_lora_billing import BASE, PRICES, cost, served


def by_name(usages) -> dict[str, tuple[int, int]]:
    return {u.model: (u.requests, u.cost_nano_usd) for u in usages}


async def test_line_items_and_usage_carry_the_adapter(redis, billing, store):  # noqa: F811
    group, consumer, stub = await billing(PRICES)
    tenant = f"lora-{uuid.uuid4().hex[:6]}"
    events = [served(tenant, a) for a in ("priced", "unpriced", "priced", "")]
    await bill(redis, group, consumer, events)

    items = {i.request_id: i.adapter for i in await line_items(stub, tenant)}
    assert [items[e.request_id] for e in events] == ["priced", "unpriced", "priced", ""]

    base, own = cost(PRICES.models[BASE]), cost(PRICES.adapters["priced"])
    adapters = {"priced": (2, 2 * own), "unpriced": (1, base)}
    usage = await stub.GetUsage(billing_pb2.GetUsageRequest(tenant=tenant))
    assert by_name(usage.adapters) == adapters
    # The models are the names the clients sent: an adapter's, or the base's.
    assert by_name(usage.models) == {**adapters, BASE: (1, base)}
    assert usage.requests == 4

    now = int(time.time())
    ranged = await stub.GetUsage(
        billing_pb2.GetUsageRequest(
            tenant=tenant,
            start=now - 3600,
            end=now + 3600,
            granularity=billing_pb2.GRANULARITY_HOUR,
        )
    )
    assert by_name(ranged.adapters) == adapters
    assert sum(b.requests for b in ranged.buckets) == 4

    other = await stub.GetUsage(billing_pb2.GetUsageRequest(tenant=f"none-{tenant}"))
    assert list(other.adapters) == [] and other.requests == 0
