"""A tier's pool is reachable only by that tier, by alias or by its deployment's own name."""

import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.conftest import MODEL

# The stub cluster's one deployment serves only the premium tier's pool.
ROUTES = f"""
models:
  chat:
    routes: [{{deployment: somewhere-else}}]
    tiers:
      premium: [{{deployment: {MODEL}}}]
"""


def tenant(tier: str) -> Tenant:
    return Tenant(name=f"tier-{uuid.uuid4().hex[:8]}", tier=tier)


async def test_another_tier_naming_the_pools_deployment_gets_model_not_found(make_cluster):
    cluster = await make_cluster(replicas=1, routes=ROUTES)
    standard = tenant("standard")
    with pytest.raises(APIError) as caught:
        await cluster.open(standard)
    assert caught.value.status == 404 and caught.value.code == "model_not_found"
    assert caught.value.param == "model"
    assert MODEL not in await cluster.pipeline.models(standard)


async def test_the_pools_tier_may_name_its_deployment(make_cluster):
    cluster = await make_cluster(replicas=1, routes=ROUTES)
    premium = tenant("premium")
    assert "".join(d.text for d in await cluster.run(premium))
    assert set(await cluster.pipeline.models(premium)) == {"chat", MODEL}
