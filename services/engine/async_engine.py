"""The asyncio face of the engine.

One dedicated thread owns the LLMEngine and runs its steps back to back while
there is work; the event loop never touches engine state. Callers hand it
commands through a thread-safe queue and read outputs from a per-request
asyncio queue, fed with call_soon_threadsafe. A caller that stops reading
(client gone) turns into an abort, so blocks are freed at once.

A request that made a step raise fails alone with RequestFailed (the engine
isolates it, llm_engine.py); EngineFailed is left for a step failure that
could not be pinned on one request, and fails every request in flight.
"""

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from services.common.logging import get_logger
from services.engine.llm_engine import LLMEngine, RequestRejected
from services.engine.request import SeqOutput
from services.engine.sampling_params import SamplingParams
from services.engine.span_events import record_timeline

log = get_logger(__name__)


class EngineFailed(RuntimeError):
    """The model step raised; every request in flight at that moment fails."""


class RequestFailed(RuntimeError):
    """This request made the step raise (or could not be added); it alone failed."""


# Queued to a request's stream when it first enters a step.
_SCHEDULED = object()


@dataclass(frozen=True)
class KvEventBatch:
    sequence: int
    events: list[tuple[str, list[int]]]


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue] = {}
        self._kv_subscribers: set[asyncio.Queue] = set()
        self._kv_pending: list[tuple[str, list[int]]] = []
        self._kv_sequence = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        engine.blocks.on_event = self._on_kv_event
        engine.on_scheduled = self._on_scheduled

    # ---- event-loop side -------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        # Reads only immutable configuration, so it is safe off the engine thread.
        self.engine.validate(prompt_ids, params)

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        tenant: str = "",
        share_prefix_cache: bool = False,
        on_scheduled: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[SeqOutput]:
        """Outputs of every sample, step by step, until all n samples finish.

        on_scheduled is awaited once, when the request first enters a step,
        before any of its outputs or its failure.
        """
        if request_id in self._streams:
            raise RequestRejected(f"request {request_id!r} is already running")
        self.validate(prompt_ids, params)
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = outputs
        self._commands.put(
            ("add", request_id, prompt_ids, params, priority, tenant, share_prefix_cache)
        )
        finished, last = 0, None
        try:
            while finished < params.n:
                item = await outputs.get()
                if item is _SCHEDULED:
                    if on_scheduled is not None:
                        await on_scheduled()
                    continue
                if isinstance(item, BaseException):
                    raise item
                if item.error is not None:
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
            if finished < params.n:
                self._commands.put(("abort", request_id))

    def abort(self, request_id: str) -> bool:
        if request_id not in self._streams:
            return False
        self._commands.put(("abort", request_id))
        return True

    async def kv_events(self) -> AsyncIterator[KvEventBatch]:
        """A snapshot of every cached block, then each change as it happens."""
        events: asyncio.Queue = asyncio.Queue()
        self._kv_subscribers.add(events)
        self._commands.put(("snapshot", events))
        try:
            while True:
                yield await events.get()
        finally:
            self._kv_subscribers.discard(events)

    def _deliver(self, outputs: list[SeqOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.put_nowait(error)

    def _publish(self, batch: KvEventBatch, only: asyncio.Queue | None = None) -> None:
        for subscriber in [only] if only else list(self._kv_subscribers):
            subscriber.put_nowait(batch)

    # ---- engine-thread side ----------------------------------------------

    def _on_scheduled(self, request_id: str) -> None:
        self._to_loop(self._deliver_scheduled, request_id)

    def _deliver_scheduled(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(_SCHEDULED)

    def _on_kv_event(self, kind: str, hashes: list[int]) -> None:
        self._kv_pending.append((kind, hashes))

    def _to_loop(self, callback, *args) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback, *args)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._take_commands(block=not self.engine.has_work)
            if self.engine.has_work:
                self._step()
            self._flush_kv_events()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt_ids, params, priority, tenant, share = command
            try:
                self.engine.add_request(request_id, prompt_ids, params, priority, tenant, share)
            except RequestRejected as exc:
                self._to_loop(self._fail, [request_id], exc)
            except Exception as exc:  # what validation missed must not end this thread
                log.exception("engine_add_failed", request_id=request_id)
                self.engine.abort(request_id)
                self._to_loop(self._fail, [request_id], RequestFailed(f"request not added: {exc}"))
        elif kind == "abort":
            self._to_loop(self._deliver, self.engine.abort(command[1]))
        elif kind == "snapshot":
            self._flush_kv_events()
            self._kv_sequence += 1
            snapshot = [("cleared", []), ("stored", list(self.engine.blocks.hash_to_block))]
            self._to_loop(self._publish, KvEventBatch(self._kv_sequence, snapshot), command[1])

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # a model bug must not wedge every caller
            log.exception("engine_step_failed")
            failed = list(self.engine.requests)
            for request_id in failed:
                self.engine.abort(request_id)
            self._to_loop(self._fail, failed, EngineFailed(f"engine step failed: {exc}"))
            return
        if outputs:
            self._to_loop(self._deliver, outputs)

    def _flush_kv_events(self) -> None:
        if not self._kv_pending:
            return
        self._kv_sequence += 1
        batch = KvEventBatch(self._kv_sequence, self._kv_pending)
        self._kv_pending = []
        self._to_loop(self._publish, batch)
