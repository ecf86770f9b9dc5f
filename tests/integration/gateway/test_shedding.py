"""A tenant refused for RPM is shed before any store is asked about it."""

import uuid

import pytest
from prometheus_client import REGISTRY

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Tenant


def quota_checks() -> float:
    return sum(
        REGISTRY.get_sample_value("maas_gateway_quota_checks_total", {"outcome": outcome}) or 0.0
        for outcome in ("ok", "exhausted", "redis_error")
    )


async def refused(cluster, who: Tenant) -> APIError:
    with pytest.raises(APIError) as caught:
        await cluster.complete(who)
    await cluster.pipeline.background.wait()
    return caught.value


async def test_a_tenant_over_its_rpm_is_refused_without_a_quota_lookup(make_cluster):
    cluster = await make_cluster(replicas=1)
    who = Tenant(name=f"shed-{uuid.uuid4().hex[:8]}", rpm=1)
    await cluster.run(who)
    # The limiter's script refuses the second request and remembers the refusal.
    assert (await refused(cluster, who)).code == "rate_limit_exceeded"
    before = quota_checks()
    error = await refused(cluster, who)
    assert (error.status, error.code) == (429, "rate_limit_exceeded")
    assert int(error.headers["Retry-After"]) >= 1
    assert quota_checks() == before
