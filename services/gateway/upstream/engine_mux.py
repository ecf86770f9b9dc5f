"""The gateway's Generate calls to one engine over one GenerateMany stream.

The engine's side, and why, is services/common/generate_mux.py. Here each
call is a MuxCall that reads as a grpc.aio Generate call does (read() to
grpc.aio.EOF or an AioRpcError with the call's own initial metadata, cancel(),
initial_metadata(), code(), done callbacks), so the engine client, its
retries, migration and reports do not know which they hold.

One stream per engine address, opened by the first call and again after it
ended; its end (the engine killed, the connection lost) ends every call it
carried with the stream's status, as each call's own stream would have ended.
An engine that answers the stream UNIMPLEMENTED (one from before it) gets
plain Generate calls (Upstreams.generate).

A call's messages wait in its own queue until read; it grants the engine
more (GenerateCall.credit) every CREDIT_EVERY messages read, so at most
GENERATE_WINDOW of them wait here.
"""

import asyncio
import contextvars
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.generate_mux import GENERATE_WINDOW, STREAM_OPEN
from maas_services.common.logging import get_logger

log = get_logger(__name__)

CREDIT_EVERY = GENERATE_WINDOW // 2
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_OPEN_KEY = STREAM_OPEN[0][0]


class MuxCall:
    """One Generate call over an engine's GenerateMany stream (module docstring)."""

    def __init__(self, mux: "EngineMux", call_id: int, timeout: float | None):
        self._mux, self._call_id = mux, call_id
        self._messages: deque[engine_pb2.GenerateResponse] = deque()
        self._read_since_credit = 0
        self._waiter: asyncio.Future | None = None
        self._initial: tuple[tuple[str, str], ...] = ()
        self._for_initial: asyncio.Future | None = None
        self._status: tuple[grpc.StatusCode, str] | None = None
        self._cancelled = False
        self._callbacks: list[Callable[[MuxCall], None]] = []
        self._timer = (
            asyncio.get_running_loop().call_later(timeout, self._expire) if timeout else None
        )

    # What the engine client and its stub read (grpc.aio.UnaryStreamCall's names).

    async def read(self):
        while not self._messages:
            if self._cancelled:
                raise asyncio.CancelledError()
            if self._status is not None:
                code, details = self._status
                if code == grpc.StatusCode.OK:
                    return grpc.aio.EOF
                raise grpc.aio.AioRpcError(
                    code, grpc.aio.Metadata(*self._initial), grpc.aio.Metadata(), details
                )
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self._read_since_credit += 1
        if self._read_since_credit == CREDIT_EVERY and self._status is None:
            self._mux.send(engine_pb2.GenerateCall(call_id=self._call_id, credit=CREDIT_EVERY))
            self._read_since_credit = 0
        return self._messages.popleft()

    def cancel(self) -> bool:
        if self.done():
            return False
        self._cancelled = True
        self._mux.send(engine_pb2.GenerateCall(call_id=self._call_id, cancel=True))
        self._end(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        return True

    def done(self) -> bool:
        return self._status is not None

    def ready(self) -> bool:
        """Whether read() answers without waiting: a message is here, or the end."""
        return bool(self._messages) or self.done()

    async def initial_metadata(self) -> grpc.aio.Metadata:
        if not self._initial and not self.done():
            self._for_initial = asyncio.get_running_loop().create_future()
            await self._for_initial
        return grpc.aio.Metadata(*self._initial)

    async def code(self) -> grpc.StatusCode:
        while not self.done():
            await self._ended()
        return self._status[0]

    def add_done_callback(self, callback: Callable[["MuxCall"], None]) -> None:
        if self.done():
            callback(self)
        else:
            self._callbacks.append(callback)

    # What the stream tells the call.

    def on_event(self, event: engine_pb2.GenerateEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "response":
            self._messages.append(event.response)
            self._wake(self._waiter)
        elif kind == "initial_metadata":
            self._initial = tuple(event.initial_metadata.entries.items())
            self._wake(self._for_initial)
        else:
            self._end(_CODES.get(event.status.code, grpc.StatusCode.UNKNOWN), event.status.details)

    def on_lost(self, code: grpc.StatusCode, details: str) -> None:
        self._end(code, details)

    def _expire(self) -> None:
        if not self.done():
            self._mux.send(engine_pb2.GenerateCall(call_id=self._call_id, cancel=True))
            self._end(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        if self.done():
            return
        self._status = (code, details)
        self._mux.forget(self._call_id)
        if self._timer is not None:
            self._timer.cancel()
        self._wake(self._waiter)
        self._wake(self._for_initial)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    async def _ended(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self._callbacks.append(lambda _: done.done() or done.set_result(None))
        await done

    @staticmethod
    def _wake(waiter: asyncio.Future | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class EngineMux:
    """One GenerateMany stream to one engine and the calls it carries."""

    def __init__(self, channel: grpc.aio.Channel, credentials: list[tuple[str, str]]):
        self._stub = engine_pb2_grpc.EngineStub(channel)
        self._credentials = credentials
        self._calls: dict[int, MuxCall] = {}
        self._ids = itertools.count(1)
        self._outbox: list[engine_pb2.GenerateCall] = []
        self._more: asyncio.Future | None = None
        self._stream = None
        self.closed = False

    async def open(self) -> bool:
        """Open the stream: True when the engine speaks it, False when it answers
        UNIMPLEMENTED; any other failure raises the call's AioRpcError."""
        self._stream = self._stub.GenerateMany(self._outgoing(), metadata=self._credentials)
        initial = await self._stream.initial_metadata()
        if not any(key == _OPEN_KEY for key, _ in initial or ()):
            code = await self._stream.code()
            self.closed = True
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return False
            raise grpc.aio.AioRpcError(
                code, grpc.aio.Metadata(), grpc.aio.Metadata(), await self._stream.details()
            )
        # Not the opening request's context: the stream outlives it and its trace.
        asyncio.get_running_loop().create_task(self._read(), context=contextvars.Context())
        return True

    def close(self) -> None:
        """Give the stream up (an opening that took too long)."""
        self.closed = True
        if self._stream is not None:
            self._stream.cancel()

    def start(
        self, request: engine_pb2.GenerateRequest, timeout: float | None, metadata
    ) -> MuxCall:
        call_id = next(self._ids)
        call = self._calls[call_id] = MuxCall(self, call_id, timeout)
        if self.closed:
            call.on_lost(grpc.StatusCode.UNAVAILABLE, "the engine's stream has ended")
            return call
        own = {key: value for key, value in metadata if (key, value) not in self._credentials}
        start = engine_pb2.GenerateStart(request=request, timeout_seconds=timeout or 0.0)
        start.metadata.update(own)
        self.send(engine_pb2.GenerateCall(call_id=call_id, start=start))
        return call

    def send(self, message: engine_pb2.GenerateCall) -> None:
        if self.closed:
            return
        self._outbox.append(message)
        if self._more is not None and not self._more.done():
            self._more.set_result(None)

    def forget(self, call_id: int) -> None:
        self._calls.pop(call_id, None)

    async def _outgoing(self) -> AsyncIterator[engine_pb2.GenerateCall]:
        loop = asyncio.get_running_loop()
        while True:
            while not self._outbox:
                self._more = loop.create_future()
                await self._more
            messages, self._outbox = self._outbox, []
            for message in messages:
                yield message

    async def _read(self) -> None:
        code, details = grpc.StatusCode.UNAVAILABLE, "the engine ended its stream"
        try:
            async for batch in self._stream:
                for event in batch.events:
                    call = self._calls.get(event.call_id)
                    if call is not None:
                        call.on_event(event)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            log.warning("engine_stream_lost", code=code.name, calls=len(self._calls))
        finally:
            self.closed = True
            for call in list(self._calls.values()):
                call.on_lost(code, details)
            self._stream.cancel()
