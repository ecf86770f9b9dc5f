"""Many Generate calls over one GenerateMany stream (engine.proto): the engine's side.

Why: a streamed token cost its reader per gRPC message, not per token (the
message's HTTP/2 frame, grpc's event-engine thread handing it to the event
loop, a read per call). A real engine makes a token for every running request
in each model step, so one message per step for all of them makes a gateway's
cost of reading a token a fraction of one message. The gateway's side is
services/gateway/upstream/engine_mux.py.

Each call runs in the servicer's own Generate, unchanged, with a CallContext
standing in for grpc's ServicerContext (abort, send_initial_metadata,
invocation_metadata, code: all a Generate uses), so a call's messages, initial
metadata and status are exactly its Generate call's. What the calls produce
goes into one list that the stream sends as one GenerateEvents when its last
write is out: events made in the same turn of the event loop (a step's
outputs, handed to every request's queue at once) share a message; nothing
waits for company, so a stream that keeps up sends each as it comes.

Flow control per call: gRPC held a Generate call whose reader was slow at its
window; here a call may have at most GENERATE_WINDOW messages its caller has
not read (GenerateCall.credit grants more), so one slow reader holds back its
own call (the engine's read-ahead, then its core's queue, as before) and never
the stream or the memory of either side.

A call ends with its status event (an abort's code, DEADLINE_EXCEEDED past the
start's timeout, UNKNOWN for a crash); a cancel from the caller cancels its
task, as a Generate call's cancel cancels its handler (the engine aborts the
request), and sends nothing more of it. The stream's end (the caller gone, the
connection lost) cancels every call it carries.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from maas.v1 import engine_pb2
from maas_services.common.grpc_interceptors import ServerCalls
from maas_services.common.logging import get_logger

log = get_logger(__name__)

# A call's messages its caller may not have read yet; the caller grants more as it reads.
GENERATE_WINDOW = 64
# Events in one message at most: 256 messages of a step with 20 logprobs a
# token for each of 64 merged tokens stay ~10 MB, far below MESSAGE_LIMIT.
MAX_EVENTS = 256
# The stream's initial metadata: what tells its caller the engine speaks it.
STREAM_OPEN = (("maas-generate-many", "1"),)
GENERATE_METHOD = "/maas.v1.Engine/Generate"

Generate = Callable[
    [engine_pb2.GenerateRequest, object], AsyncIterator[engine_pb2.GenerateResponse]
]


class CallContext:
    """What a Generate handler asks of its context, for a call of a GenerateMany stream."""

    def __init__(self, call: "_Call", metadata: dict[str, str]):
        self._call = call
        self._metadata = tuple(metadata.items())
        self._code: grpc.StatusCode | None = None
        self.details = ""
        self._sent_metadata = False

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self.details = code, details

    async def send_initial_metadata(self, metadata) -> None:
        # Once, and before any message, as grpc allows it.
        if not self._sent_metadata:
            self._sent_metadata = True
            entries = engine_pb2.CallMetadata(entries=dict(metadata))
            self._call.emit(engine_pb2.GenerateEvent(initial_metadata=entries))

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.set_code(code, details)
        raise grpc.aio.AbortError()


@dataclass(eq=False)
class _Call:
    call_id: int
    stream: "_Stream"
    granted: int = GENERATE_WINDOW
    sent: int = 0
    for_credit: asyncio.Future | None = None
    task: asyncio.Task | None = field(default=None, repr=False)

    def emit(self, event: engine_pb2.GenerateEvent) -> None:
        event.call_id = self.call_id
        self.stream.emit(event)

    def credit(self, count: int) -> None:
        self.granted += count
        if self.for_credit is not None and not self.for_credit.done():
            self.for_credit.set_result(None)

    async def send(self, response: engine_pb2.GenerateResponse) -> None:
        while self.sent >= self.granted:
            self.for_credit = asyncio.get_running_loop().create_future()
            await self.for_credit
        self.sent += 1
        self.emit(engine_pb2.GenerateEvent(response=response))


class _Stream:
    """One GenerateMany stream's calls and the events they made that are not sent yet."""

    def __init__(self, generate: Generate, calls: ServerCalls | None):
        self._generate = generate
        self._observer = calls
        self._method = calls.method(GENERATE_METHOD) if calls is not None else None
        self.calls: dict[int, _Call] = {}
        self.events: list[engine_pb2.GenerateEvent] = []
        self.caller_done = False
        self._wake: asyncio.Future | None = None

    def emit(self, event: engine_pb2.GenerateEvent) -> None:
        self.events.append(event)
        self.wake()

    def wake(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def ready(self) -> list[engine_pb2.GenerateEvent] | None:
        """The events made since the last call; None once the caller is done and no call is left."""
        while not self.events:
            if self.caller_done and not self.calls:
                return None
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        # One turn more: the other requests of the step that woke this are
        # already scheduled to run, and their events join these.
        await asyncio.sleep(0)
        events, self.events = self.events[:MAX_EVENTS], self.events[MAX_EVENTS:]
        return events

    async def read(self, requests: AsyncIterator[engine_pb2.GenerateCall]) -> None:
        try:
            async for message in requests:
                action = message.WhichOneof("action")
                call = self.calls.get(message.call_id)
                if action == "start":
                    if call is None:
                        self._start(message.call_id, message.start)
                elif call is None:
                    continue  # a call that has ended: its credit or cancel is late
                elif action == "credit":
                    call.credit(message.credit)
                elif action == "cancel":
                    self.calls.pop(message.call_id)
                    call.task.cancel()
        finally:
            self.caller_done = True
            self.wake()

    def _start(self, call_id: int, start: engine_pb2.GenerateStart) -> None:
        call = self.calls[call_id] = _Call(call_id, self)
        call.task = asyncio.ensure_future(self._run(call, start))

    async def _run(self, call: _Call, start: engine_pb2.GenerateStart) -> None:
        ctx = CallContext(call, dict(start.metadata))
        try:
            await self._served(call, start, ctx)
        except grpc.aio.AbortError:
            pass
        except asyncio.CancelledError:
            # The caller cancelled it, or the stream ended: nobody to tell.
            return
        except Exception as exc:  # what grpc answers a handler that raised
            log.exception("generate_call_failed", call_id=call.call_id)
            ctx.set_code(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        finally:
            self.calls.pop(call.call_id, None)
        code = ctx.code() or grpc.StatusCode.OK
        status = engine_pb2.CallStatus(code=code.value[0], details=ctx.details)
        call.emit(engine_pb2.GenerateEvent(status=status))

    async def _served(self, call: _Call, start: engine_pb2.GenerateStart, ctx: CallContext) -> None:
        if self._observer is None:
            await self._generated(call, start, ctx)
            return
        with self._observer.observed(self._method, ctx):
            await self._generated(call, start, ctx)

    async def _generated(self, call: _Call, start: engine_pb2.GenerateStart, ctx) -> None:
        try:
            async with asyncio.timeout(start.timeout_seconds or None):
                async for response in self._generate(start.request, ctx):
                    await call.send(response)
        except TimeoutError:
            ctx.set_code(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    async def close(self) -> None:
        calls, self.calls = list(self.calls.values()), {}
        for call in calls:
            call.task.cancel()
        if calls:
            await asyncio.wait([call.task for call in calls])


class GenerateMux:
    """A servicer's GenerateMany over its own Generate. `calls`: the server's
    spans and metrics, so each call is observed as a Generate call is (None
    for a server without them)."""

    def __init__(self, generate: Generate, calls: ServerCalls | None = None):
        self._generate = generate
        self._calls = calls

    async def serve(
        self, requests: AsyncIterator[engine_pb2.GenerateCall], context
    ) -> AsyncIterator[engine_pb2.GenerateEvents]:
        stream = _Stream(self._generate, self._calls)
        await context.send_initial_metadata(STREAM_OPEN)
        reader = asyncio.ensure_future(stream.read(requests))
        try:
            while (events := await stream.ready()) is not None:
                yield engine_pb2.GenerateEvents(events=events)
        finally:
            reader.cancel()
            await stream.close()
