"""An SSE stream's start, first frame and end pass the middleware's send; the
frames between go to uvicorn's own (http_protocol.BODY_SEND), in order."""

import asyncio
import json

import pytest

from maas_services.gateway.http_api.disconnect import WATCH, ClientWatch
from maas_services.gateway.http_api.http_protocol import BODY_SEND
from maas_services.gateway.http_api.http_stream import EventStream


async def frames(count: int, closed: list[bool]):
    try:
        for i in range(count):
            yield f"data: {i}\n\n".encode()
    finally:
        closed.append(True)


async def test_frames_between_the_first_and_the_end_skip_the_middleware():
    wire, middleware, closed = [], [], []

    async def uvicorn_send(message):
        wire.append(message)

    async def wrapped_send(message):
        middleware.append(message)
        await uvicorn_send(message)

    scope = {"type": "http", "extensions": {BODY_SEND: uvicorn_send}}
    stream = EventStream(frames(4, closed), media_type="text/event-stream")
    await stream(scope, None, wrapped_send)

    assert [m.get("body") for m in wire] == [
        None,
        b"data: 0\n\n",
        *(b"data: %d\n\n" % i for i in (1, 2, 3)),
        b"",
    ]
    assert wire[0]["status"] == 200 and wire[-1]["more_body"] is False
    # The middleware sees the status, the first byte and the end.
    assert [m.get("body") for m in middleware] == [None, b"data: 0\n\n", b""]
    assert closed == [True]


async def test_without_the_extension_every_message_passes_the_middleware():
    middleware, closed = [], []

    async def wrapped_send(message):
        middleware.append(message)

    await EventStream(frames(3, closed), media_type="text/event-stream")(
        {"type": "http"}, None, wrapped_send
    )
    assert len(middleware) == 5 and closed == [True]


async def test_a_client_gone_mid_stream_stops_the_frames_and_closes_them():
    watch, sent, closed = ClientWatch(), [], []
    blocked = asyncio.Event()

    async def uvicorn_send(message):
        sent.append(message)
        if len(sent) == 3:
            await blocked.wait()  # a client that stopped reading

    scope = {"type": "http", "extensions": {WATCH: watch, BODY_SEND: uvicorn_send}}
    stream = EventStream(frames(10, closed), media_type="text/event-stream")
    task = asyncio.ensure_future(stream(scope, None, uvicorn_send))
    while len(sent) < 3:
        await asyncio.sleep(0)
    watch.lost()  # the connection's loss cancels the request's task
    await asyncio.wait_for(task, 1)
    assert len(sent) == 3 and closed == [True]
    assert not task.cancelled()  # the leaving is the client's, not an error


async def test_a_stream_the_servers_stop_cancels_ends_with_an_error_event():
    """uvicorn cancels the requests still running once its graceful stop times out:
    the client gets an error event and the body's end, not a connection cut."""
    sent, closed = [], []
    blocked = asyncio.Event()

    async def uvicorn_send(message):
        sent.append(message)
        if len(sent) == 3:
            await blocked.wait()  # a stream in the middle of its answer

    scope = {"type": "http", "extensions": {WATCH: ClientWatch(), BODY_SEND: uvicorn_send}}
    stream = EventStream(frames(10, closed), media_type="text/event-stream")
    task = asyncio.ensure_future(stream(scope, None, uvicorn_send))
    while len(sent) < 3:
        await asyncio.sleep(0)
    task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
    await asyncio.wait([task], timeout=1)
    assert task.cancelled()
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last.get("more_body", False)
    error = json.loads(last["body"].decode().removeprefix("data: "))["error"]
    assert error["code"] == "service_unavailable" and "stopped" in error["message"]
    assert len(sent) == 4 and closed == [True]


async def test_cancelled_before_the_start_sends_nothing():
    sent, closed = [], []

    async def send(message):
        sent.append(message)

    stream = EventStream(frames(3, closed), media_type="text/event-stream")
    task = asyncio.ensure_future(stream({"type": "http"}, None, send))
    await asyncio.sleep(0)  # the request's task awaits the stream's, not yet run
    task.cancel()
    await asyncio.wait([task], timeout=1)
    assert task.cancelled() and sent == []
    # Closed before it ever ran: nothing to clean up, and nothing more to give.
    with pytest.raises(StopAsyncIteration):
        await anext(stream.body_iterator)
