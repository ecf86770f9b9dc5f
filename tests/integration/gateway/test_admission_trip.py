"""A prepaid request's TPM charge and balance hold travel in one Redis round trip
(services/gateway/admission/store_trip.py); whichever of the two refuses it, the
other's part is given back as for any request that ends.

The gateway's pipeline over stub engines and real Redis, with the price table
billing would publish.
"""

import uuid
from decimal import Decimal

import pytest

from maas_services.common.balance_reservations import reservation_keys
from maas_services.common.openai_api.errors import APIError
from maas_services.common.prices import PRICES_KEY, ModelPrice, PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.conftest import MODEL

PRICE = ModelPrice(input=Decimal(1), cached_input=Decimal("0.5"), output=Decimal(2))
PROMPT = [11, 12, 13, 14]


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    await client.set(PRICES_KEY, PriceTable(models={MODEL: PRICE}).model_dump_json())
    yield client
    await client.aclose()


async def prepaid(redis, nano_usd: int, **limits) -> Tenant:
    tenant = Tenant(name=f"trip-{uuid.uuid4().hex[:8]}", **limits)
    await Quotas(redis).top_up(tenant.name, nano_usd)
    return tenant


async def test_a_request_the_limiter_refuses_keeps_no_hold_on_the_balance(make_cluster, redis):
    cluster = await make_cluster(replicas=1)
    balance = 10**12
    who = await prepaid(redis, balance, tpm=100)
    assert await cluster.run(who, prompt=PROMPT, max_tokens=3)
    await cluster.pipeline.background.wait()
    # Admitted last, the tenant is charged once tokenized, in its hold's round
    # trip: the hold was taken when the limiter refused (100 tokens a minute).
    with pytest.raises(APIError) as refused:
        await cluster.run(who, prompt=PROMPT, max_tokens=95)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    await cluster.pipeline.background.wait()
    # Only the served request's, until billing charges it.
    assert len(await redis.hgetall(reservation_keys(who.name)[1])) == 1
    assert (await Quotas(redis).state(who.name)).balance_nano_usd == balance


async def test_a_request_the_balance_refuses_gives_back_its_slot_and_tokens(make_cluster, redis):
    cluster = await make_cluster(replicas=1)
    # Worth a request of 3 tokens, not one of 8; one request at a time.
    who = await prepaid(redis, PRICE.most_nano_usd(len(PROMPT), 3), tpm=20, max_concurrency=1)
    for _ in range(3):  # counted first, then in the hold's round trip
        with pytest.raises(APIError) as refused:
            await cluster.run(who, prompt=PROMPT, max_tokens=8)
        assert refused.value.code == "insufficient_quota"
        await cluster.pipeline.background.wait()
    # Each refusal ended its lease and settled its 12 tokens to 0: the next fits.
    assert await cluster.run(who, prompt=PROMPT, max_tokens=3)


async def test_the_round_trip_survives_a_redis_that_lost_its_scripts(make_cluster, redis):
    cluster = await make_cluster(replicas=1)
    who = await prepaid(redis, 10**12, tpm=1000, max_concurrency=1)
    for _ in range(2):  # counted first, then in the hold's round trip
        assert await cluster.run(who, prompt=PROMPT, max_tokens=3)
        await cluster.pipeline.background.wait()
        # A restarted Redis forgets its scripts: refused in the pipeline, sent again alone.
        await redis.script_flush()
    assert len(await redis.hgetall(reservation_keys(who.name)[1])) == 2
