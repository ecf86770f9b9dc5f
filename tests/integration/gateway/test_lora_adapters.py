"""A LoRA adapter named as the model: routed to its base with the adapter, visible only
to its tenants, listed with its parent, billed with the adapter on the usage event."""

import uuid
from dataclasses import replace
from decimal import Decimal

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.prices import PRICES_KEY, ModelPrice, PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, parsed, read_as_a_front
from tests.integration.gateway.private_redis import private_redis
from tests.integration.gateway.usage_stream import usage_events


def routes(owner: str) -> str:
    return f"""
deployments:
  {MODEL}: {{}}
adapters:
  private-{owner}:
    deployment: {MODEL}
    source: /adapters/private
    tenants: [{owner}]
  public-{owner}:
    deployment: {MODEL}
    source: /adapters/public
"""


def tenant(**limits) -> Tenant:
    return Tenant(name=f"lora-{uuid.uuid4().hex[:8]}", **limits)


async def run(cluster, who: Tenant, model: str) -> str:
    request = replace(parsed(), model=model)
    run = await cluster.pipeline.admit(Principal(who, "key_test"), request)
    text = "".join([d.text async for d in read_as_a_front(run)])
    await cluster.pipeline.background.wait()
    return text


async def test_an_adapter_runs_on_its_base_deployment_and_is_billed_by_it(make_cluster, redis_url):
    owner = tenant()
    cluster = await make_cluster(replicas=1, routes=routes(owner.name))
    cluster.engines[0].adapters.add(f"private-{owner.name}")
    assert await run(cluster, owner, f"private-{owner.name}")
    assert cluster.engines[0].adapters_served == [f"private-{owner.name}"]
    assert cluster.router.adapters_picked == [f"private-{owner.name}"]
    assert await run(cluster, owner, MODEL)
    assert cluster.engines[0].adapters_served[-1] == ""
    events = await usage_events(redis_url, owner.name)
    assert [(e.model, e.deployment, e.adapter) for e in events] == [
        (f"private-{owner.name}", MODEL, f"private-{owner.name}"),
        (MODEL, MODEL, ""),
    ]


async def test_another_tenant_gets_model_not_found_and_loads_nothing(make_cluster):
    owner, other = tenant(), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(owner.name))
    with pytest.raises(APIError) as caught:
        await run(cluster, other, f"private-{owner.name}")
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")
    # Word for word what a name that exists nowhere gets.
    with pytest.raises(APIError) as unknown:
        await run(cluster, other, "no-such-model")
    assert caught.value.message.replace(f"private-{owner.name}", "X") == (
        unknown.value.message.replace("no-such-model", "X")
    )
    assert cluster.engines[0].served == 0 and cluster.engines[0].loads == []


async def test_models_lists_the_adapters_a_key_may_use_with_their_parent(make_cluster):
    owner, other = tenant(), tenant()
    cluster = await make_cluster(replicas=1, routes=routes(owner.name))
    # Loaded by flag (--lora-modules): no table entry, every tenant's.
    cluster.router.adapters[MODEL] = ["flagged", f"private-{owner.name}"]
    expected = {MODEL: "", f"public-{owner.name}": MODEL, "flagged": MODEL}
    assert await cluster.pipeline.models(other) == expected
    assert await cluster.pipeline.models(owner) == {**expected, f"private-{owner.name}": MODEL}
    # A key limited to some models lists only those.
    limited = tenant(allowed_models=("flagged",))
    assert await cluster.pipeline.models(limited) == {"flagged": MODEL}


async def test_a_shared_adapter_runs_for_any_tenant_and_is_never_loaded(make_cluster):
    cluster = await make_cluster(replicas=1)
    cluster.router.adapters[MODEL] = ["flagged"]
    cluster.engines[0].adapters.add("flagged")
    assert await run(cluster, tenant(), "flagged")
    assert cluster.engines[0].adapters_served == ["flagged"]
    # An engine that lost it answers NOT_FOUND: the gateway has no source to load.
    cluster.engines[0].adapters.clear()
    with pytest.raises(APIError) as caught:
        await run(cluster, tenant(), "flagged")
    assert caught.value.status == 404 and cluster.engines[0].loads == []


async def test_a_prepaid_request_holds_its_adapters_own_price(make_cluster, tmp_path):
    owner = tenant()
    adapter = f"private-{owner.name}"
    base = ModelPrice(input=Decimal(1), output=Decimal(1))
    table = PriceTable(models={MODEL: base}, adapters={adapter: ModelPrice(input=Decimal(1000))})
    # A Redis of the test's own: the price table it publishes is no other test's.
    async with private_redis(tmp_path) as (url, _):
        redis = open_redis(url)
        try:
            await redis.set(PRICES_KEY, table.model_dump_json())
            # Enough for the base's most at max_tokens 3 (3 prompt + 3 completion tokens),
            # a fraction of the adapter's prompt.
            await Quotas(redis).top_up(owner.name, base.most_nano_usd(3, 3))
            cluster = await make_cluster(replicas=1, routes=routes(owner.name), via_redis=url)
            cluster.engines[0].adapters.add(adapter)
            request = replace(parsed(max_tokens=3), model=adapter)
            with pytest.raises(APIError) as caught:
                await cluster.pipeline.admit(Principal(owner, "key_test"), request)
            assert (caught.value.status, caught.value.code) == (429, "insufficient_quota")
            assert cluster.engines[0].served == 0
            request = replace(parsed(max_tokens=3), model=MODEL)
            run = await cluster.pipeline.admit(Principal(owner, "key_test"), request)
            assert "".join([d.text async for d in read_as_a_front(run)])
            await cluster.pipeline.background.wait()
        finally:
            await redis.aclose()
