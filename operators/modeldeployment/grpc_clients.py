"""The operator's gRPC calls: pool statistics from the router; Drain, LoadAdapter and
UnloadAdapter to engines."""

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from maas_operator.modeldeployment.drain import Replica
from maas_services.common.grpc_client import open_channel

CALLER = "operator"


class PoolStatsUnavailable(RuntimeError):
    pass


class RouterClient:
    def __init__(self, address: str, timeout_seconds: float = 5.0):
        self._channel = open_channel(address, CALLER)
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._timeout = timeout_seconds

    async def pool_stats(self, model: str) -> router_pb2.DeploymentStats | None:
        """This model's statistics; None when the router knows no replica of it."""
        try:
            stats = await self._stub.GetPoolStats(
                router_pb2.PoolStatsRequest(model=model), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise PoolStatsUnavailable(f"router: {exc.code().name}: {exc.details()}") from exc
        return next((d for d in stats.deployments if d.model == model), None)

    async def close(self) -> None:
        await self._channel.close()


def replicas_of(stats: router_pb2.DeploymentStats) -> list[Replica]:
    return [
        Replica(
            endpoint_id=r.endpoint_id,
            address=r.address,
            ready=r.ready,
            draining=r.draining,
            running=r.running,
            waiting=r.waiting,
            in_flight=r.in_flight,
            adapters=tuple(r.adapters),
        )
        for r in stats.replicas
    ]


async def drain_engine(address: str, timeout_seconds: float = 10.0) -> int:
    """Tell one engine to stop admitting; returns the requests it still has."""
    channel = open_channel(address, CALLER)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        response = await stub.Drain(engine_pb2.DrainRequest(), timeout=timeout_seconds)
        return response.in_flight
    finally:
        await channel.close()


# Loading reads and checks one PEFT folder: seconds, not minutes.
ADAPTER_TIMEOUT_SECONDS = 60.0


async def load_adapter(address: str, name: str, source: str) -> None:
    """LoadAdapter on one engine; raises grpc.aio.AioRpcError with the engine's refusal."""
    channel = open_channel(address, CALLER)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        request = engine_pb2.LoadAdapterRequest(name=name, source=source)
        await stub.LoadAdapter(request, timeout=ADAPTER_TIMEOUT_SECONDS)
    finally:
        await channel.close()


async def unload_adapter(address: str, name: str) -> bool:
    """UnloadAdapter on one engine; whether it had the adapter."""
    channel = open_channel(address, CALLER)
    try:
        stub = engine_pb2_grpc.EngineStub(channel)
        request = engine_pb2.UnloadAdapterRequest(name=name)
        response = await stub.UnloadAdapter(request, timeout=ADAPTER_TIMEOUT_SECONDS)
        return response.found
    finally:
        await channel.close()
