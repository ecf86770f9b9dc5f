"""An adapter's stream whose engine dies resumes on a replica that lacks the adapter:
that replica loads it first (within the tenant's bounds), and the client's stream
goes on; a load refused ends the stream with "error", never another tenant's cost."""

import uuid
from dataclasses import replace

import grpc
import pytest

from maas.v1 import engine_pb2_grpc
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, parsed
from tests.integration.gateway.stubs import start
from tests.integration.gateway.test_migration import PROMPT, WORDS, ResumingEngine, text_of

ADAPTER = "mig-lora"
ROUTES = f"""
deployments:
  {MODEL}: {{}}
adapters:
  {ADAPTER}: {{deployment: {MODEL}, source: /adapters/mig}}
"""


class AdapterResumingEngine(ResumingEngine):
    """ResumingEngine that serves only the adapters it has loaded (NOT_FOUND otherwise)."""

    async def Generate(self, request, context):
        if request.adapter not in self.adapters:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"adapter {request.adapter!r}")
        async for response in super().Generate(request, context):
            yield response


@pytest.fixture
async def replicas(make_cluster):
    """A cluster of two AdapterResumingEngines: e0 has the adapter, e1 not; the
    router picks e0 first."""
    cluster = await make_cluster(replicas=0, routes=ROUTES)
    engines, servers = [], []
    for index in range(2):
        engine = AdapterResumingEngine()
        server, address = await start(engine, engine_pb2_grpc.add_EngineServicer_to_server)
        engines.append(engine)
        servers.append(server)
        cluster.router.endpoints.append((f"e{index}", address, MODEL))
    engines[0].adapters.add(ADAPTER)
    yield cluster, engines
    for server in servers:
        await server.stop(0)


async def stream(cluster, tenant: Tenant) -> list:
    request = replace(parsed(prompt=PROMPT), model=ADAPTER)
    run = await cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    async with run:
        deltas = [delta async for delta in run.deltas]
    await cluster.pipeline.background.wait()
    return deltas


async def test_the_replica_resumed_on_loads_the_adapter_first(replicas):
    cluster, engines = replicas
    engines[0].die_after = 5
    deltas = await stream(cluster, Tenant(name=f"mig-{uuid.uuid4().hex[:8]}"))
    assert text_of(deltas) == "".join(WORDS)
    assert engines[1].loads == [(ADAPTER, "/adapters/mig")]
    assert engines[1].resumes[-1] == [1, 2, 3, 4, 5]


async def test_a_load_refused_ends_the_stream_with_error(replicas):
    cluster, engines = replicas
    engines[0].die_after = 5
    tenant = Tenant(name=f"mig-{uuid.uuid4().hex[:8]}", adapter_loads_per_minute=1)
    assert text_of(await stream(cluster, tenant)) == "".join(WORDS)
    # Its one load a minute is spent; e1 loses the adapter, e0 dies again.
    engines[1].adapters.clear()
    deltas = await stream(cluster, tenant)
    assert text_of(deltas) == "".join(WORDS[:5])
    assert deltas[-1].finish_reason == "error"
    assert len(engines[1].loads) == 1
