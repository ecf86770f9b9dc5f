"""The routing table's share_prefix_cache reaches the router and the engine with the tenant."""

from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.conftest import MODEL

SHARED = f"""
deployments:
  {MODEL}: {{share_prefix_cache: true}}
"""


async def test_requests_carry_their_tenant_and_do_not_ask_to_share_by_default(make_cluster):
    cluster = await make_cluster(replicas=1)
    await cluster.run(Tenant(name="acme"))
    assert cluster.router.cache_scopes == [("acme", False)]
    assert cluster.engines[0].cache_scopes == [("acme", False)]


async def test_a_deployment_marked_shared_asks_router_and_engine_to_share(make_cluster):
    cluster = await make_cluster(replicas=1, routes=SHARED)
    await cluster.run(Tenant(name="acme"))
    assert cluster.router.cache_scopes == [("acme", True)]
    assert cluster.engines[0].cache_scopes == [("acme", True)]
