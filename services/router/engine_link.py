"""The router's connection to one engine: GetLoad polling and the KV event stream.

Either one failing with UNAVAILABLE (the process is gone, the connection was
refused or reset) takes the replica out of picking at once; so do a few polls
in a row failing otherwise (a hung engine), while one slow answer from a busy
engine does not. The next successful poll brings it back. The event stream
reconnects with backoff; while it is down the replica's index entries are
dropped, so prefix scoring falls back to routing history rather than trusting
a view that may be stale.
"""

import asyncio
import time

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.logging import get_logger
from maas_services.router.endpoints import Endpoint
from maas_services.router.kv_events import apply_batch
from maas_services.router.pick_history import PickHistory
from maas_services.router.prefix_index import PrefixIndex

log = get_logger(__name__)

RECONNECT_MIN_SECONDS = 0.2
RECONNECT_MAX_SECONDS = 5.0
MIN_POLL_TIMEOUT_SECONDS = 5.0
# Polls in a row that may fail (other than UNAVAILABLE) before the replica is out.
POLL_FAILURES_TOLERATED = 2


class EngineLink:
    def __init__(
        self,
        endpoint: Endpoint,
        index: PrefixIndex,
        history: PickHistory,
        poll_interval: float,
    ):
        self.endpoint = endpoint
        self._index = index
        self._history = history
        self._poll_interval = poll_interval
        self._channel = open_channel(endpoint.address, "router")
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._tasks: list[asyncio.Task] = []
        self._poll_failures = 0

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._poll_forever()),
            asyncio.create_task(self._stream_events()),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close()
        self._index.clear(self.endpoint.endpoint_id)
        self._history.remove(self.endpoint.endpoint_id)

    async def poll_once(self) -> None:
        e = self.endpoint
        timeout = max(MIN_POLL_TIMEOUT_SECONDS, self._poll_interval * 4)
        # Picks from here on may not be in the answer; earlier ones are, about.
        counted = e.picked_since_poll
        asked = time.monotonic()
        try:
            load = await self._stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            self._poll_failures += 1
            if (
                exc.code() == grpc.StatusCode.UNAVAILABLE
                or self._poll_failures > POLL_FAILURES_TOLERATED
            ):
                self._unreachable(f"GetLoad: {exc.code().name}")
            return
        self._poll_failures = 0
        if not e.reachable:
            log.info("engine_reachable", endpoint=e.endpoint_id, model=load.model)
        e.reachable = True
        e.apply_report(load, counted, asked)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            await self.poll_once()

    async def _stream_events(self) -> None:
        e = self.endpoint
        backoff = RECONNECT_MIN_SECONDS
        while True:
            try:
                first = True  # each stream begins with the engine's snapshot
                async for batch in self._stub.StreamKvEvents(engine_pb2.KvEventsRequest()):
                    e.kv_events_live = True
                    backoff = RECONNECT_MIN_SECONDS
                    apply_batch(self._index, self._history, e, batch, first)
                    first = False
                self._events_lost("stream ended")
            except grpc.aio.AioRpcError as exc:
                self._events_lost(exc.code().name)
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return  # an engine without events: routing history only
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self._unreachable("kv event stream: UNAVAILABLE")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)

    def _events_lost(self, why: str) -> None:
        if self.endpoint.kv_events_live:
            log.warning("kv_events_lost", endpoint=self.endpoint.endpoint_id, why=why)
        self.endpoint.kv_events_live = False
        self._index.clear(self.endpoint.endpoint_id)

    def _unreachable(self, why: str) -> None:
        if self.endpoint.reachable:
            log.warning("engine_unreachable", endpoint=self.endpoint.endpoint_id, why=why)
        self.endpoint.reachable = False
