"""Through the pipeline: a private adapter removed from the routing table while the router
still reports it loaded is neither listed nor served, to any tenant."""

import uuid
from dataclasses import replace

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, parsed, read_as_a_front


async def test_a_removed_private_adapter_still_loaded_serves_no_one(make_cluster, tmp_path):
    owner, other = (Tenant(name=f"ret-{uuid.uuid4().hex[:8]}") for _ in range(2))
    adapter = f"private-{owner.name}"
    routes = f"deployments:\n  {MODEL}: {{}}\n"
    listed = (
        f"adapters:\n  {adapter}: {{deployment: {MODEL}, source: /a, tenants: [{owner.name}]}}\n"
    )
    cluster = await make_cluster(replicas=1, routes=routes + listed)
    cluster.router.adapters[MODEL] = [adapter]
    cluster.engines[0].adapters.add(adapter)
    assert adapter in await cluster.pipeline.models(owner)
    # The adapter leaves the table (its ModelDeployment's spec edited); the engine keeps it.
    (tmp_path / "routes.yaml").write_text(routes)
    assert cluster.pipeline.routes.reload()
    for who in (owner, other):
        assert await cluster.pipeline.models(who) == {MODEL: ""}
        with pytest.raises(APIError) as caught:
            run = await cluster.pipeline.admit(
                Principal(who, "key_test"), replace(parsed(), model=adapter)
            )
            [d async for d in read_as_a_front(run)]
        assert (caught.value.status, caught.value.code) == (404, "model_not_found")
    assert cluster.engines[0].adapters_served == []
