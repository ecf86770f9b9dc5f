"""A real maas.v1.Engine gRPC server on loopback whose cache and load the test scripts.

It speaks the engine's KV event protocol: each subscriber first gets CLEARED
then STORED with everything cached and ADAPTER_LOADED for each adapter its load
report lists, then every change as it happens.
"""

import asyncio

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc

KIND = engine_pb2.KvEvent.Kind


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, engine_id: str, model: str = "m", events: bool = True):
        self.engine_id = engine_id
        self.load = engine_pb2.LoadReport(model=model, max_num_seqs=8, kv_cache_blocks=64)
        self.cached: set[int] = set()
        self._events = events
        self._subscribers: set[asyncio.Queue] = set()
        self._sequence = 0
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> "FakeEngine":
        self._server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop(None)
        self._subscribers.clear()

    def store(self, hashes: list[int]) -> None:
        self.cached.update(hashes)
        self._publish(engine_pb2.KvEvent(kind=KIND.KIND_STORED, block_hashes=hashes))

    def evict(self, hashes: list[int]) -> None:
        self.cached.difference_update(hashes)
        self._publish(engine_pb2.KvEvent(kind=KIND.KIND_EVICTED, block_hashes=hashes))

    def load_adapter(self, name: str) -> None:
        self.load.adapters.append(name)
        self._publish(engine_pb2.KvEvent(kind=KIND.KIND_ADAPTER_LOADED, adapter=name))

    def unload_adapter(self, name: str) -> None:
        self.load.adapters.remove(name)
        self._publish(engine_pb2.KvEvent(kind=KIND.KIND_ADAPTER_UNLOADED, adapter=name))

    def _batch(self, *events: engine_pb2.KvEvent) -> engine_pb2.KvEventBatch:
        self._sequence += 1
        return engine_pb2.KvEventBatch(
            sequence=self._sequence, engine_id=self.engine_id, events=events
        )

    def _publish(self, event: engine_pb2.KvEvent) -> None:
        batch = self._batch(event)
        for queue in self._subscribers:
            queue.put_nowait(batch)

    async def GetLoad(self, request, context):
        return self.load

    async def StreamKvEvents(self, request, context):
        if not self._events:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no KV events here")
        queue: asyncio.Queue = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield self._batch(
                engine_pb2.KvEvent(kind=KIND.KIND_CLEARED),
                engine_pb2.KvEvent(kind=KIND.KIND_STORED, block_hashes=sorted(self.cached)),
                *(
                    engine_pb2.KvEvent(kind=KIND.KIND_ADAPTER_LOADED, adapter=name)
                    for name in self.load.adapters
                ),
            )
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)
