"""The router's view of the engine pool: polling loads and tracking picks."""

import asyncio

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc
from services.common.grpc_client import open_channel
from services.common.logging import get_logger
from services.router.endpoints import Endpoint

log = get_logger(__name__)


class EnginePool:
    def __init__(self, endpoints: list[Endpoint], poll_interval: float):
        self.endpoints = {e.endpoint_id: e for e in endpoints}
        self._poll_interval = poll_interval
        self._channels = {e.endpoint_id: open_channel(e.address, "router") for e in endpoints}
        self._picks: dict[str, str] = {}  # request id -> endpoint id
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        for channel in self._channels.values():
            await channel.close()

    def for_model(self, model: str) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if e.model == model]

    def models(self) -> list[str]:
        return sorted({e.model for e in self.endpoints.values() if e.model})

    def record_pick(self, request_id: str, endpoint: Endpoint) -> None:
        previous = self._picks.pop(request_id, None)
        if previous in self.endpoints:
            self.endpoints[previous].in_flight -= 1
        self._picks[request_id] = endpoint.endpoint_id
        endpoint.in_flight += 1

    def release(self, request_id: str) -> bool:
        endpoint_id = self._picks.pop(request_id, None)
        if endpoint_id is None:
            return False
        self.endpoints[endpoint_id].in_flight -= 1
        return True

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(e) for e in self.endpoints.values()))

    async def _poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self._poll_interval)

    async def _poll(self, endpoint: Endpoint) -> None:
        stub = engine_pb2_grpc.EngineStub(self._channels[endpoint.endpoint_id])
        try:
            load = await stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=self._poll_interval * 4)
        except grpc.aio.AioRpcError as exc:
            if endpoint.ready:
                log.warning(
                    "engine_unreachable", endpoint=endpoint.endpoint_id, code=exc.code().name
                )
            endpoint.ready = False
            return
        if not endpoint.ready:
            log.info("engine_ready", endpoint=endpoint.endpoint_id, model=load.model)
        endpoint.ready = True
        endpoint.model = load.model
        endpoint.draining = load.draining
        endpoint.running = load.running
        endpoint.waiting = load.waiting
        endpoint.kv_cache_usage = load.kv_cache_usage
        endpoint.max_num_seqs = load.max_num_seqs
