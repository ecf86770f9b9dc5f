"""A prepaid balance holds each request's most cost from admission until billing charges it.

The gateway's pipeline over stub engines, real Redis, and the real billing
consumer, which publishes the price table the gateway reserves at and drops a
request's hold in the commit that charges its balance.
"""

import asyncio
import uuid
from decimal import Decimal

import grpc
import pytest

from maas_services.billing.consumer import UsageConsumer
from maas_services.common.balance_reservations import reservation_keys
from maas_services.common.openai_api.errors import APIError
from maas_services.common.prices import PRICES_KEY, ModelPrice, PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.quota_gate import QuotaGate
from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.conftest import CHUNKS, MODEL
from tests.integration.router.conftest import eventually

# 1,000 nano-USD a prompt token, 2,000 a completion token.
PRICE = ModelPrice(input=Decimal(1), cached_input=Decimal("0.5"), output=Decimal(2))
PROMPT = [11, 12, 13, 14]


def most(max_tokens: int, n: int = 1) -> int:
    return PRICE.most_nano_usd(len(PROMPT), n * max_tokens)


REAL = PRICE.cost_nano_usd(len(PROMPT), 0, len(CHUNKS))  # what a stub stream costs


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def billing(redis):
    """A billing consumer pricing MODEL; its published table is the gateway's."""
    table = PriceTable(models={MODEL: PRICE})
    consumer = UsageConsumer(
        redis, f"g-{uuid.uuid4().hex[:6]}", "c0", batch=100, block_ms=50, prices=table
    )
    task = asyncio.create_task(consumer.run())
    await eventually(lambda: _published(redis, table), timeout=30, what="the price table published")
    yield consumer
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _published(redis, table: PriceTable) -> bool:
    raw = await redis.get(PRICES_KEY)
    return raw is not None and PriceTable.model_validate_json(raw) == table


async def prepaid(redis, nano_usd: int) -> Tenant:
    tenant = Tenant(name=f"prepaid-{uuid.uuid4().hex[:8]}")
    await Quotas(redis).top_up(tenant.name, nano_usd)
    return tenant


async def held(redis, tenant: Tenant) -> dict[str, str]:
    """The tenant's reservations: request id -> nano-USD."""
    return await redis.hgetall(reservation_keys(tenant.name)[1])


async def billed(consumer: UsageConsumer, tenant: Tenant, requests: int) -> None:
    async def done():
        return (await consumer.ledger.totals(tenant.name))[0].requests == requests

    await eventually(done, timeout=30, what=f"{requests} requests billed")


def insufficient(outcome) -> bool:
    return (
        isinstance(outcome, APIError)
        and outcome.status == 429
        and outcome.code == "insufficient_quota"
    )


async def test_twenty_concurrent_requests_against_a_balance_worth_one_serve_one(
    make_cluster, billing, redis
):
    cluster = await make_cluster(delay=0.05)
    tenant = await prepaid(redis, most(max_tokens=3))
    outcomes = await asyncio.gather(
        *(cluster.run(tenant, prompt=PROMPT, max_tokens=3) for _ in range(20)),
        return_exceptions=True,
    )
    served = [o for o in outcomes if isinstance(o, list)]
    assert len(served) == 1
    assert "".join(d.text for d in served[0]) == "".join(CHUNKS)
    assert sum(insufficient(o) for o in outcomes) == 19
    await cluster.pipeline.background.wait()
    await billed(billing, tenant, 1)
    # Charged what it used; its hold went with the charge.
    assert (await Quotas(redis).state(tenant.name)).balance_nano_usd == most(3) - REAL
    assert await held(redis, tenant) == {}


async def test_a_finished_request_gives_back_what_it_held_beyond_its_cost(
    make_cluster, billing, redis
):
    cluster = await make_cluster(replicas=1)
    # The first request leaves after one token: it costs its prompt and that token.
    first_cost = PRICE.cost_nano_usd(len(PROMPT), 0, 1)
    # Room for one request's most (max_tokens 10), and for another's only once
    # the first's real cost is known.
    tenant = await prepaid(redis, most(10) + first_cost)
    engine = cluster.engines[0]
    engine.stall_after = 1
    first = await cluster.open(tenant, prompt=PROMPT, max_tokens=10)
    await anext(first)  # streaming, its most held
    with pytest.raises(APIError) as refused:
        await cluster.run(tenant, prompt=PROMPT, max_tokens=10)
    assert insufficient(refused.value)
    assert "left beside the requests in flight" in refused.value.message
    engine.stall_after = None
    await first.aclose()
    await cluster.pipeline.background.wait()
    # Held at its real cost until billing charges it, then gone.
    assert [int(v) for v in (await held(redis, tenant)).values()] in ([], [first_cost])
    second = await cluster.run(tenant, prompt=PROMPT, max_tokens=10)
    assert "".join(d.text for d in second) == "".join(CHUNKS)
    await cluster.pipeline.background.wait()
    await billed(billing, tenant, 2)
    assert await held(redis, tenant) == {}
    balance = (await Quotas(redis).state(tenant.name)).balance_nano_usd
    assert balance == most(10) - REAL


async def test_a_request_that_bills_nothing_releases_its_hold(make_cluster, billing, redis):
    cluster = await make_cluster(replicas=1)
    tenant = await prepaid(redis, most(3))
    cluster.engines[0].fail = grpc.StatusCode.INVALID_ARGUMENT  # refused before any token
    with pytest.raises(APIError) as failed:
        await cluster.run(tenant, prompt=PROMPT, max_tokens=3)
    assert failed.value.status == 400
    await cluster.pipeline.background.wait()
    assert await held(redis, tenant) == {}
    cluster.engines[0].fail = None
    # The whole balance is there for the next request.
    served = await cluster.run(tenant, prompt=PROMPT, max_tokens=3)
    assert "".join(d.text for d in served) == "".join(CHUNKS)


async def test_a_hold_whose_gateway_died_lapses(billing, redis):
    tenant = await prepaid(redis, most(3))
    gate = QuotaGate(redis, hold_seconds=0.2)
    crashed = gate.reservation(tenant.name, "req-crashed")
    await crashed.take(MODEL, len(PROMPT), 3)  # never settled: its gateway is gone
    with pytest.raises(APIError) as refused:
        await gate.reservation(tenant.name, "req-next").take(MODEL, len(PROMPT), 3)
    assert insufficient(refused.value)

    async def admitted() -> bool:
        try:
            await gate.reservation(tenant.name, "req-later").take(MODEL, len(PROMPT), 3)
        except APIError:
            return False
        return True

    await eventually(admitted, timeout=10, what="the crashed gateway's hold lapsed")
    assert list(await held(redis, tenant)) == ["req-later"]


async def test_pay_as_you_go_tenants_hold_nothing(make_cluster, billing, redis):
    cluster = await make_cluster(replicas=1)
    tenant = Tenant(name=f"payg-{uuid.uuid4().hex[:8]}")
    outcomes = await asyncio.gather(
        *(cluster.run(tenant, prompt=PROMPT, max_tokens=3) for _ in range(5))
    )
    assert len(outcomes) == 5
    assert await held(redis, tenant) == {}
