"""A gateway pipeline in the test's loop, over stub engines, router, tokenizer and real Redis."""

import uuid
from dataclasses import dataclass

import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc, router_pb2_grpc, tokenizer_pb2_grpc
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.parsed_request import ParsedRequest, TextPrompt
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.run import Run
from maas_services.gateway.server import build_pipeline
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.upstreams import Upstreams
from tests.integration.gateway.stubs import StubEngine, StubRouter, StubTokenizer, start

MODEL = "stub-model"
CHUNKS = ["Hello", " there", " friend"]


@dataclass
class StubCluster:
    engines: list[StubEngine]
    router: StubRouter
    tokenizer: StubTokenizer
    pipeline: Pipeline

    async def run(self, tenant: Tenant | None = None, **spec) -> list[Delta]:
        deltas = await self.open(tenant, **spec)
        return [d async for d in deltas]

    async def open(self, tenant: Tenant | None = None, **request):
        """Admit a request and return its delta stream (not yet started), read as
        a front reads it: delivered once it ends."""
        return read_as_a_front(await self.complete(tenant, **request))

    async def complete(self, tenant: Tenant | None = None, **request) -> Run:
        tenant = tenant or Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
        return await self.pipeline.admit(Principal(tenant, "key_test"), parsed(**request))


async def read_as_a_front(run: Run):
    async with run:
        async for delta in run.deltas:
            yield delta


def parsed(
    n: int = 1,
    max_tokens: int | None = None,
    prompt: list[int] | str = "Hi",
    session_id: str = "",
    **sampling,
) -> ParsedRequest:
    """A request for MODEL as a front would hand it to the pipeline."""
    return ParsedRequest(
        request_id=f"req-{uuid.uuid4().hex}",
        model=MODEL,
        prompt=TextPrompt(prompt),
        sampling=engine_pb2.SamplingParams(n=n, max_tokens=max_tokens or 0, **sampling),
        session_id=session_id,
    )


@pytest.fixture
async def make_cluster(redis_url, tmp_path):
    """make_cluster(replicas=2, chunks=..., delay=..., **gateway settings)."""
    servers, redis_clients, upstreams, pipelines = [], [], [], []

    async def make(
        replicas: int = 2,
        chunks=CHUNKS,
        delay: float = 0.0,
        routes="",
        via_redis: str = "",  # another address of the same Redis (a relay)
        **settings,
    ):
        engines, endpoints = [], []
        for index in range(replicas):
            engine = StubEngine(MODEL, list(chunks), delay)
            server, address = await start(engine, engine_pb2_grpc.add_EngineServicer_to_server)
            servers.append(server)
            engines.append(engine)
            endpoints.append((f"e{index}", address, MODEL))
        router = StubRouter(endpoints)
        server, router_address = await start(router, router_pb2_grpc.add_RouterServicer_to_server)
        servers.append(server)
        tokenizer = StubTokenizer()
        server, tokenizer_address = await start(
            tokenizer, tokenizer_pb2_grpc.add_TokenizerServicer_to_server
        )
        servers.append(server)
        config = GatewaySettings(
            redis_url=via_redis or redis_url,
            router_address=router_address,
            models_cache_seconds=0,
            usage_spool_dir=str(tmp_path / f"spool-{len(pipelines)}"),
            **settings,
        )
        redis = open_redis(via_redis or redis_url)
        redis_clients.append(redis)
        up = Upstreams(tokenizer_address, router_address)
        upstreams.append(up)
        routes_file = tmp_path / "routes.yaml"
        routes_file.write_text(routes)
        pipeline = build_pipeline(config, up, redis, RoutesWatcher(str(routes_file)))
        pipelines.append(pipeline)
        return StubCluster(engines, router, tokenizer, pipeline)

    yield make
    for pipeline in pipelines:
        await pipeline.background.wait()
    for up in upstreams:
        await up.close()
    for server in servers:
        await server.stop(0)
    for redis in redis_clients:
        await redis.aclose()
