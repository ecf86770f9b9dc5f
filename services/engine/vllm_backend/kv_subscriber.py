"""Subscribe to vLLM's ZeroMQ KV-event publisher and fan its events out to StreamKvEvents.

vLLM publishes [topic, sequence (8 bytes, big-endian), payload] per batch on a
PUB socket, which drops what a slow or late subscriber misses. A sequence
that skips (or restarts, vLLM having restarted) means our map may be wrong:
it is dropped and every StreamKvEvents subscriber is told KIND_CLEARED, as the
native engine's consumers expect (services/router/kv_events.py). Each new
subscriber first gets CLEARED then STORED with every block held, then
ADAPTER_LOADED for each adapter vLLM holds, as from the native engine. vLLM
publishes nothing of adapters: the servicer tells of each LoadAdapter and
UnloadAdapter that succeeded (adapter_changed).
"""

import asyncio
from collections.abc import AsyncIterator

import msgspec
import zmq
import zmq.asyncio

from maas_services.common.logging import get_logger
from maas_services.engine.async_engine import KvEventBatch
from maas_services.engine.core.protocol import ADAPTER_LOADED, CLEARED, STORED
from maas_services.engine.vllm_backend.kv_translation import Events, KvTranslator

log = get_logger(__name__)


class KvSubscriber:
    def __init__(self, endpoint: str, translator: KvTranslator):
        self._endpoint = endpoint
        self._translator = translator
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        self._next_sequence: int | None = None
        self._sequence = 0  # ours, monotonic over every subscriber's batches
        self._subscribers: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._socket.connect(self._endpoint)
        self._task = asyncio.create_task(self._receive())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._socket.close()
        self._context.term()

    async def batches(self, adapters: list[str]) -> AsyncIterator[KvEventBatch]:
        """adapters: those vLLM holds now, for the snapshot."""
        queue: asyncio.Queue = asyncio.Queue()
        self._sequence += 1
        loaded = [(ADAPTER_LOADED, name) for name in adapters]
        snapshot = [(CLEARED, []), (STORED, self._translator.held()), *loaded]
        queue.put_nowait(KvEventBatch(self._sequence, snapshot))
        self._subscribers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)

    async def _receive(self) -> None:
        while True:
            _topic, sequence_bytes, payload = await self._socket.recv_multipart()
            sequence = int.from_bytes(sequence_bytes, "big")
            if self._next_sequence is not None and sequence != self._next_sequence:
                log.warning("vllm_kv_events_gap", expected=self._next_sequence, received=sequence)
                self._publish(self._translator.clear())
            self._next_sequence = sequence + 1
            try:
                # [ts, events, data_parallel_rank?]
                events = self._translator.apply(msgspec.msgpack.decode(payload)[1])
            except (msgspec.DecodeError, LookupError, TypeError) as exc:
                log.warning("vllm_kv_events_undecodable", error=repr(exc))
                events = self._translator.clear()
            self._publish(events)

    def adapter_changed(self, kind: str, name: str) -> None:
        """An adapter was loaded or unloaded: kind is protocol.ADAPTER_(UN)LOADED."""
        self._publish([(kind, name)])

    def _publish(self, events: Events) -> None:
        if not events:
            return
        self._sequence += 1
        batch = KvEventBatch(self._sequence, events)
        for queue in self._subscribers:
            queue.put_nowait(batch)
