"""Fake engines and in-process routers talking real gRPC on loopback."""

import asyncio
import time
from dataclasses import dataclass

import grpc
import pytest

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common.grpc_server import ServerHandle
from maas_services.router.pool import EnginePool
from maas_services.router.server import start
from maas_services.router.settings import RouterSettings
from tests.integration.router.fake_engine import FakeEngine

pytestmark = pytest.mark.timeout(60)

TENANT = "t"  # who picks, unless a test says otherwise


@dataclass
class Router:
    handle: ServerHandle
    pool: EnginePool
    channel: grpc.aio.Channel
    closed: bool = False

    @property
    def stub(self) -> router_pb2_grpc.RouterStub:
        return router_pb2_grpc.RouterStub(self.channel)

    async def pick(
        self,
        tokens: list[int],
        session: str = "",
        exclude=(),
        request_id="",
        tenant: str = TENANT,
        share_prefix_cache: bool = False,
    ) -> str:
        request_id = request_id or f"r{time.monotonic_ns()}"
        reply = await self.stub.Pick(
            router_pb2.PickRequest(
                request_id=request_id,
                model="m",
                token_ids=tokens,
                tenant=tenant,
                session_id=session,
                exclude_endpoint_ids=list(exclude),
                share_prefix_cache=share_prefix_cache,
            )
        )
        return reply.endpoint_id

    async def stats(self) -> router_pb2.DeploymentStats:
        reply = await self.stub.GetPoolStats(router_pb2.PoolStatsRequest(model="m"))
        return reply.deployments[0]

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.channel.close()
        await self.handle.server.stop(None)
        await self.pool.close()


class Cluster:
    def __init__(self) -> None:
        self.engines: list[FakeEngine] = []
        self.routers: list[Router] = []

    async def engine(self, engine_id: str, **kwargs) -> FakeEngine:
        engine = await FakeEngine(engine_id, **kwargs).start()
        self.engines.append(engine)
        return engine

    async def router(self, **settings) -> Router:
        settings.setdefault("poll_interval_seconds", 0.1)
        settings.setdefault("engines", [f"{e.engine_id}={e.address}" for e in self.engines])
        handle, pool = await start(RouterSettings(**settings))
        router = Router(handle, pool, grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}"))
        self.routers.append(router)
        return router

    async def close(self) -> None:
        for router in self.routers:
            await router.close()
        for engine in self.engines:
            await engine.stop()


@pytest.fixture
async def cluster():
    running = Cluster()
    try:
        yield running
    finally:
        await running.close()


async def eventually(check, timeout: float = 10.0, what: str = ""):
    """Await an async or plain check until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)
