"""Prices follow the deployment that served a request, not the name the client
sent: an alias and a canary, routed by the chart's routing table, priced by the
chart's price table, billed by the real consumer on a real Redis and read back
through the real Billing gRPC service."""

import asyncio
import time
import uuid
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client import REGISTRY

from maas.v1 import billing_pb2, billing_pb2_grpc
from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.servicer import BillingServicer
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.routing.routing_table import Alias, RoutingTable, Target, pick
from tests.integration.billing.stopping import stopped

VALUES = yaml.safe_load((Path(__file__).parents[3] / "charts" / "maas" / "values.yaml").read_text())
ALIAS, STABLE, CANARY = "smollm2", "smollm2-135m-instruct", "smollm2-135m-instruct-canary"
PROMPT, COMPLETION = 1000, 100


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def billing(redis, store):
    """A consumer in a group of its own, and the Billing service on loopback
    over the ledger it writes."""
    servers = []

    async def start(prices: PriceTable) -> tuple[str, UsageConsumer, billing_pb2_grpc.BillingStub]:
        group = f"g-{uuid.uuid4().hex[:6]}"
        consumer = UsageConsumer(
            redis, group, "c0", batch=50, block_ms=100, prices=prices, store=store
        )
        server = grpc.aio.server()
        billing_pb2_grpc.add_BillingServicer_to_server(BillingServicer(consumer.ledger), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        return group, consumer, billing_pb2_grpc.BillingStub(channel)

    yield start
    for server in servers:
        await server.stop(None)


def chart_table(**models: Alias) -> RoutingTable:
    values = VALUES["routingTable"]
    return RoutingTable.model_validate({**values, "models": {**values["models"], **models}})


def served(table: RoutingTable, tenant: str, session: str, running: set[str]) -> UsageEvent:
    """The usage event the gateway writes for one request to the alias."""
    route = table.resolve(ALIAS, "standard", session, running)
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model=route.alias,
        deployment=route.deployment,
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
        started_at=time.time(),
    )


async def bill(redis, group: str, consumer: UsageConsumer, events: list[UsageEvent]) -> None:
    """Publish the events and run the consumer until it has acked all of them."""
    await consumer.ensure_group()
    for event in events:
        last = await redis.xadd(USAGE_STREAM, event.to_fields())
    task = asyncio.create_task(consumer.run())

    async def acked() -> bool:
        (info,) = [g for g in await redis.xinfo_groups(USAGE_STREAM) if g["name"] == group]
        return info["last-delivered-id"] == last and info["pending"] == 0

    try:
        async with asyncio.timeout(30):
            while not await acked():
                await asyncio.sleep(0.05)
    finally:
        await stopped(task)


async def line_items(stub, tenant: str) -> list[billing_pb2.LineItem]:
    reply = await stub.ListLineItems(billing_pb2.ListLineItemsRequest(tenant=tenant))
    return list(reply.items)


def unpriced(deployment: str) -> float:
    value = REGISTRY.get_sample_value(
        "maas_billing_unpriced_events_total", {"deployment": deployment}
    )
    return value or 0.0


def price_of(prices: PriceTable, deployment: str) -> int:
    return prices.models[deployment].cost_nano_usd(PROMPT, 0, COMPLETION)


async def test_the_default_charts_alias_is_billed_at_its_deployments_price(redis, billing):
    prices = PriceTable.model_validate(VALUES["prices"])
    group, consumer, stub = await billing(prices)
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    before = unpriced(STABLE)
    await bill(redis, group, consumer, [served(chart_table(), tenant, "", {STABLE})])

    (item,) = await line_items(stub, tenant)
    assert (item.model, item.deployment) == (ALIAS, STABLE)
    assert item.cost_nano_usd == price_of(prices, STABLE) > 0
    usage = await stub.GetUsage(billing_pb2.GetUsageRequest(tenant=tenant))
    assert [(m.model, m.cost_nano_usd) for m in usage.models] == [(ALIAS, item.cost_nano_usd)]
    assert unpriced(STABLE) == before


async def test_a_canary_is_billed_at_its_own_price(redis, billing):
    prices = PriceTable.model_validate(VALUES["prices"])
    prices.models[CANARY] = ModelPrice(input=Decimal("0.5"), output=Decimal("1"))
    routes = [Target(deployment=STABLE, weight=90), Target(deployment=CANARY, weight=10)]
    table = chart_table(**{ALIAS: Alias(routes=routes)})
    # Sessions are sticky to a deployment: one that lands on each side of the split.
    sessions = {pick(routes, f"{ALIAS}/s{i}"): f"s{i}" for i in range(200)}
    group, consumer, stub = await billing(prices)
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    events = [served(table, tenant, sessions[d], {STABLE, CANARY}) for d in (STABLE, CANARY)]
    await bill(redis, group, consumer, events)

    items = await line_items(stub, tenant)
    assert sorted((i.model, i.deployment, i.cost_nano_usd) for i in items) == [
        (ALIAS, STABLE, price_of(prices, STABLE)),
        (ALIAS, CANARY, price_of(prices, CANARY)),
    ]


async def test_a_deployment_with_no_price_is_counted_once_per_request(redis, billing):
    group, consumer, stub = await billing(PriceTable.model_validate(VALUES["prices"]))
    tenant, deployment = f"t-{uuid.uuid4().hex[:6]}", f"unpriced-{uuid.uuid4().hex[:6]}"
    event = served(chart_table(), tenant, "", {STABLE}).model_copy(
        update={"deployment": deployment}
    )
    # Delivered twice (a gateway retry): billed once, counted once.
    await bill(redis, group, consumer, [event, event])

    (item,) = await line_items(stub, tenant)
    assert (item.deployment, item.cost_nano_usd) == (deployment, 0)
    assert unpriced(deployment) == 1
