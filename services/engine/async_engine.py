"""The asyncio face of the engine core, in the serving process.

The core (services/engine/core) owns the LLMEngine in its own process; this
client binds the two ipc:// sockets it connects to, sends it one message per
input (add, abort, KV snapshot, shutdown) and reads one StepBatch per step,
fanning outputs out to per-request asyncio queues, KV events to their
subscribers and the load snapshot to GetLoad. A caller that stops reading
(client gone) turns into an abort, so blocks are freed at once.

A request that made a step raise fails alone with RequestFailed (the engine
isolates it, llm_engine.py), and so does one the core refused to add (an
AdapterError subclass when the adapter it named is why: lora/errors.py);
EngineFailed is left for a step failure that could not be pinned on one
request, and fails every request in flight. CoreDied ends every stream when
the core process is gone: the server then reports NOT_SERVING and exits.

Adapters: load_adapter and unload_adapter send one message each and await the
core's answer by token; `adapters` is the loaded set as of the core's latest
batch (it sends the set whenever it changed), so the load report costs nothing.
KV event subscribers see each change as an adapter_loaded or adapter_unloaded
event, and the set itself in their snapshot, after its blocks.
"""

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from maas_services.common.logging import get_logger
from maas_services.engine.core import protocol
from maas_services.engine.core.addresses import CoreAddresses
from maas_services.engine.lora.errors import (
    AdapterError,
    AdapterInvalid,
    AdapterNotFound,
    AdapterSlotsFull,
    LoraDisabled,
)
from maas_services.engine.lora.loaded import LoadedAdapter
from maas_services.engine.request import SeqOutput
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.span_events import record_timeline

log = get_logger(__name__)


class EngineFailed(RuntimeError):
    """The model step raised; every request in flight at that moment fails."""


class RequestFailed(RuntimeError):
    """This request made the step raise (or could not be added); it alone failed."""


class CoreDied(RuntimeError):
    """The engine-core process exited while this engine was serving."""


# Queued to a request's stream when it first enters a step.
_SCHEDULED = object()

# The core names an adapter refusal by its class (protocol.Failure, AdapterAnswer).
ADAPTER_ERRORS: dict[str, type[AdapterError]] = {
    error.__name__: error
    for error in (LoraDisabled, AdapterInvalid, AdapterSlotsFull, AdapterNotFound)
}


def adapter_error(name: str, message: str) -> Exception:
    """The core's refusal as its exception; RuntimeError for what was no AdapterError (a bug)."""
    return ADAPTER_ERRORS.get(name, RuntimeError)(message)


@dataclass(frozen=True)
class KvEventBatch:
    sequence: int
    events: list[protocol.KvEvent]


class AsyncEngine:
    def __init__(self, addresses: CoreAddresses, on_metrics: Callable[[bytes], None] | None = None):
        self._context = zmq.Context()
        self._inputs = self._context.socket(zmq.PUSH)
        # Never block the event loop on a send: inputs are small and few.
        self._inputs.setsockopt(zmq.SNDHWM, 0)
        self._inputs.bind(addresses.inputs)
        self._async_context = zmq.asyncio.Context()
        self._outputs = self._async_context.socket(zmq.PULL)
        self._outputs.setsockopt(zmq.RCVHWM, 0)
        self._outputs.bind(addresses.outputs)
        self._on_metrics = on_metrics
        self._streams: dict[str, asyncio.Queue] = {}
        self._kv_subscribers: set[asyncio.Queue] = set()
        self._kv_waiting: dict[int, asyncio.Queue] = {}
        self._kv_tokens = itertools.count()
        self._kv_sequence = 0
        self._adapter_answers: dict[int, asyncio.Future] = {}
        self._adapter_tokens = itertools.count()
        self.adapters: list[str] = []  # loaded, as of the core's latest batch
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.info: protocol.Ready | None = None
        self.load = protocol.Load()
        self.died = asyncio.Event()
        self.death: str | None = None

    # ---- lifecycle -------------------------------------------------------

    async def start(self, core_exit: Awaitable[int] | None = None) -> None:
        """Wait for the core's Ready; then, if given its exit, watch for its death."""
        ready = asyncio.ensure_future(self._outputs.recv())
        waits = {ready}
        exited = asyncio.ensure_future(core_exit) if core_exit is not None else None
        if exited is not None:
            waits.add(exited)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            code = exited.result()
            raise CoreDied(f"the engine core exited with code {code} before it was ready")
        message = protocol.decode_output(ready.result())
        assert isinstance(message, protocol.Ready), message
        self.info = message
        self.adapters = message.adapters
        self._tasks.append(asyncio.create_task(self._read()))
        if exited is not None:
            self._tasks.append(asyncio.create_task(self._watch(exited)))

    async def stop(self) -> None:
        self._stopping = True
        self._send(protocol.Shutdown())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._outputs.close(linger=0)
        self._inputs.close(linger=1000)
        self._async_context.term()
        self._context.term()

    async def _watch(self, exited: Awaitable[int]) -> None:
        code = await exited
        if self._stopping:
            return
        self.death = f"the engine core exited with code {code}; this engine-worker is restarting"
        log.error("engine_core_died", exit_code=code, in_flight=len(self._streams))
        error = CoreDied(self.death)
        for queue in [*self._streams.values(), *self._kv_subscribers, *self._kv_waiting.values()]:
            queue.put_nowait(error)
        for answer in self._adapter_answers.values():
            if not answer.done():
                answer.set_exception(error)
        self.died.set()

    # ---- requests --------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        tenant: str = "",
        share_prefix_cache: bool = False,
        adapter: str = "",
        on_scheduled: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[SeqOutput]:
        """Outputs of every sample, step by step, until all n samples finish.

        adapter: the loaded adapter to run with (empty: the base model);
        AdapterNotFound if the core has none of that name.

        on_scheduled is awaited once, when the request first enters a step,
        before any of its outputs or its failure.
        """
        if self.death is not None:
            raise CoreDied(self.death)
        if request_id in self._streams:
            raise RequestFailed(f"request {request_id!r} is already running")
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = outputs
        self._send(
            protocol.Add(
                request_id, prompt_ids, params, priority, tenant, share_prefix_cache, adapter
            )
        )
        finished, last, ended = 0, None, False
        try:
            while finished < params.n:
                item = await outputs.get()
                if item is _SCHEDULED:
                    if on_scheduled is not None:
                        await on_scheduled()
                    continue
                if isinstance(item, BaseException):
                    # The core has already forgotten the request (or is gone).
                    ended = True
                    raise item
                if item.error is not None:
                    ended = True
                    raise RequestFailed(item.error)
                # An abort ends every sample, even those not yet forked from
                # a prompt still in prefill: nothing more will come.
                aborted = item.finish_reason == "abort"
                finished = params.n if aborted else finished + (item.finish_reason is not None)
                last = item
                yield item
        finally:
            del self._streams[request_id]
            if last is not None:
                record_timeline(last)
            if finished < params.n and not ended and self.death is None:
                self._send(protocol.Abort(request_id))

    def abort(self, request_id: str) -> bool:
        if request_id not in self._streams:
            return False
        self._send(protocol.Abort(request_id))
        return True

    async def load_adapter(self, name: str, source: str) -> LoadedAdapter:
        """Load the PEFT folder at source (on the core's file system) as adapter name;
        the AdapterError subclass that says why not (services/engine/lora/errors.py)."""
        answer = await self._adapter_call(protocol.LoadAdapter, name, source)
        return answer.loaded

    async def unload_adapter(self, name: str) -> bool:
        """Unload adapter name (running requests finish on it); False if it was not loaded."""
        answer = await self._adapter_call(protocol.UnloadAdapter, name)
        return answer.found

    async def _adapter_call(self, message_type, *fields) -> protocol.AdapterAnswer:
        if self.death is not None:
            raise CoreDied(self.death)
        token = next(self._adapter_tokens)
        answer = asyncio.get_running_loop().create_future()
        self._adapter_answers[token] = answer
        self._send(message_type(token, *fields))
        try:
            # A caller that leaves does not undo the load: the core applies it anyway.
            result = await answer
        finally:
            self._adapter_answers.pop(token, None)
        if result.error:
            raise adapter_error(result.error, result.message)
        return result

    async def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """A snapshot of every cached block and loaded adapter, then each change as it
        happens (adapters loaded and unloaded among them)."""
        if self.death is not None:
            raise CoreDied(self.death)
        events: asyncio.Queue = asyncio.Queue()
        token = next(self._kv_tokens)
        self._kv_waiting[token] = events
        self._send(protocol.KvSnapshot(token))
        try:
            while True:
                item = await events.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._kv_waiting.pop(token, None)
            self._kv_subscribers.discard(events)

    def _send(self, message) -> None:
        self._inputs.send(protocol.encode(message))

    # ---- what the core sends ---------------------------------------------

    async def _read(self) -> None:
        while True:
            message = protocol.decode_output(await self._outputs.recv())
            if isinstance(message, protocol.StepBatch):
                self._deliver(message)
            elif isinstance(message, protocol.KvHashes):
                self._subscribe(message)
            elif isinstance(message, protocol.AdapterAnswer):
                answer = self._adapter_answers.get(message.token)
                if answer is not None and not answer.done():
                    answer.set_result(message)

    def _deliver(self, batch: protocol.StepBatch) -> None:
        self.load = batch.load
        if batch.adapters is not None:
            self.adapters = batch.adapters
        if batch.metrics and self._on_metrics is not None:
            self._on_metrics(batch.metrics)
        for request_id in batch.scheduled:
            self._put(request_id, _SCHEDULED)
        for output in batch.outputs:
            self._put(output.request_id, output)
        for failure in batch.failures:
            if failure.adapter_error:
                error = adapter_error(failure.adapter_error, failure.message)
            else:
                error = (EngineFailed if failure.engine else RequestFailed)(failure.message)
            self._put(failure.request_id, error)
        if batch.kv_events:
            self._kv_sequence += 1
            for subscriber in list(self._kv_subscribers):
                subscriber.put_nowait(KvEventBatch(self._kv_sequence, batch.kv_events))

    def _put(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(item)

    def _subscribe(self, snapshot: protocol.KvHashes) -> None:
        events = self._kv_waiting.pop(snapshot.token, None)
        if events is None:
            return  # the subscriber left before its snapshot came
        self._kv_sequence += 1
        loaded = [(protocol.ADAPTER_LOADED, name) for name in snapshot.adapters]
        events.put_nowait(
            KvEventBatch(
                self._kv_sequence,
                [(protocol.CLEARED, []), (protocol.STORED, snapshot.hashes), *loaded],
            )
        )
        self._kv_subscribers.add(events)
