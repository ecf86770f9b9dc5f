"""A completion over HTTP: through the pipeline, then one JSON body or an SSE stream.

Shared by the chat and text routes; everything that differs between them is
in openai_format.ResponseShape. The request's Run (run.py) is closed once the
last byte is sent (the stream's end, or the JSON response's background task),
or at once on a path that sends nothing more of it.

Everything here runs in the task uvicorn gives the request, the SSE stream
included (EventStream); a client
that leaves cancels that task's work through its connection's watch
(disconnect.py).

A stream writes what is ready together as one write: the deltas that arrived
while the last write was going out (a client slow to read, a busy event loop)
are taken together (common/ready_batches.py told_batches: the engine call says
what it holds) and merged (ResponseShape.ready_together), one chunk per
choice with all their text and one logprobs entry per token, as OpenAI's own
chunks hold several tokens; a client that keeps up gets each delta as it comes.

Tool calls pass the output filter once read (openai_format.screen_calls): a
blocked call ends its choice with finish_reason "content_filter", as blocked
text does in the run (run.py); the stream ends when every choice has.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.errors import CLIENT_CLOSED, APIError, unavailable
from maas_services.common.openai_api.openai_format import Choices, ResponseShape, screen_calls
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.common.openai_api.schemas import SamplingFields
from maas_services.common.openai_api.sse import DONE, sse
from maas_services.common.ready_batches import prepend, told_batches
from maas_services.gateway.http_api.disconnect import ClientGoneError, cancelled_if_gone
from maas_services.gateway.http_api.http_metrics import RESPONSES
from maas_services.gateway.http_api.http_protocol import BODY_SEND
from maas_services.gateway.pipeline import Pipeline, with_headers
from maas_services.gateway.run import Run

STREAM_BROKEN = APIError(
    502, "the model stopped responding mid-stream", type="api_error", code="upstream_error"
)
# A stream still running when the server's stop has waited its grace period out.
STOPPED = unavailable("the gateway stopped before the answer ended; send the request again")


_ENCODE = msgspec.json.Encoder().encode


class TextFrames:
    """The SSE frames of a stream's text-only chunks (ResponseShape.text_only), most
    of a stream's: a choice's differ only in the text, so the rest is encoded once
    and each frame is that around the text's JSON string, not a chunk built and
    encoded whole for every token."""

    _MARK = "\x00"

    def __init__(self, shape: ResponseShape, include_usage: bool):
        self._shape = shape
        self._include_usage = include_usage
        self._around: dict[int, tuple[bytes, bytes]] = {}

    def __call__(self, delta: Delta) -> bytes:
        around = self._around.get(delta.index)
        if around is None:
            frame = sse(self._shape.text_chunk(delta.index, self._MARK, self._include_usage))
            # The text is the chunk's last string: what follows it is nulls.
            head, _, tail = frame.rpartition(_ENCODE(self._MARK))
            around = self._around[delta.index] = (head, tail)
        return around[0] + _ENCODE(delta.text) + around[1]


class EventStream(StreamingResponse):
    """An SSE response sent from a task of its own, its frames past the middleware.

    Starlette streams from another task, beside a third waiting for
    http.disconnect, unless the server speaks ASGI 2.4 (uvicorn does not); a
    client that leaves cancels this one's (disconnect.py). A task of its own,
    not the request's: each frame resumes this task's few coroutine frames,
    not the request's ~25 under the middleware and routing. The start, the
    first frame and the end go through the middleware (they see the status,
    the first byte and the end); the frames between are written with
    uvicorn's own send (http_protocol.BODY_SEND), the middleware's wrappers
    passing body messages through unread. With uvloop and one engine generator
    per request: 0.057 -> 0.048 gateway CPU-ms per streamed token at 32 streams
    (docs/gateway.md, "The event loop and the frames' path"). A stream the
    server's stop cuts (its grace period over) ends with an error event
    (STOPPED). The frames' generator is closed here whatever happens, so its
    cleanup never waits for the GC."""

    started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_send = scope.get("extensions", {}).get(BODY_SEND, send)
        try:
            with cancelled_if_gone(scope):
                # Cancelling the request's task cancels the one it awaits.
                await asyncio.ensure_future(self._send_frames(send, body_send))
        except ClientGoneError:
            pass
        except asyncio.CancelledError:
            # Not the client's leaving: the server's stop, past its grace period
            # (uvicorn cancels the requests still running). The client is told, and
            # the body ends, instead of the connection closing mid-stream. Each frame
            # is one write, so the last one sent was whole.
            if self.started:
                await send({"type": "http.response.body", "body": sse(STOPPED.body())})
            raise
        finally:
            await self.body_iterator.aclose()

    async def _send_frames(self, send: Send, body_send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        self.started = True
        frame_send = send
        async for frame in self.body_iterator:
            await frame_send({"type": "http.response.body", "body": frame, "more_body": True})
            frame_send = body_send
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def respond(
    request: Request, pipeline: Pipeline, parsed: ParsedRequest, body: SamplingFields, chat: bool
) -> Response:
    try:
        # A client gone while its request waits (a queue slot, a cold start)
        # gives its place up at once.
        with cancelled_if_gone(request.scope):
            run = await pipeline.admit(request.state.principal, parsed)
    except ClientGoneError:
        return gone(request.url.path)
    shape = ResponseShape.answering(parsed, body, chat, run.ticket.prompt.tool_format)
    try:
        return await _answer(request, shape, body, run, pipeline.output_filter)
    except APIError as exc:
        await run.close()
        raise with_headers(exc, run.headers) from None
    except BaseException:
        await run.close()
        raise


def gone(route: str) -> Response:
    RESPONSES.labels(route, CLIENT_CLOSED).inc()
    return Response(status_code=CLIENT_CLOSED)


async def collect(
    shape: ResponseShape,
    first: Delta,
    deltas: AsyncIterator[Delta],
    output_filter: OutputFilter,
) -> dict:
    choices, last = Choices(), first
    try:
        async for delta in prepend(first, deltas):
            if delta.finish_reason == "error":
                raise STREAM_BROKEN
            choices.add(delta)
            last = delta
    finally:
        await deltas.aclose()
    full = shape.full(choices, last)
    for choice in full["choices"]:
        if "message" in choice:
            screen_calls(output_filter, choice, choice["message"])
        if choices.finish[choice["index"]] == "content_filter":
            # The filter cut the text after a call: the client must know, so
            # not "tool_calls" (the stream's parser keeps it the same way).
            choice["finish_reason"] = "content_filter"
    return full


async def _answer(
    request: Request,
    shape: ResponseShape,
    body: SamplingFields,
    run: Run,
    output_filter: OutputFilter,
) -> Response:
    route, deltas, headers = request.url.path, run.deltas, run.headers
    try:
        # Pull the first delta before answering, so failures before any token
        # (no capacity, bad prompt ids) still get a proper status code.
        with cancelled_if_gone(request.scope):
            first = await anext(deltas)
            if not body.stream:
                full = await collect(shape, first, deltas, output_filter)
    except ClientGoneError:
        await run.close()
        return gone(route)
    if not body.stream:
        RESPONSES.labels(route, 200).inc()
        return JSONResponse(full, headers=headers, background=BackgroundTask(run.close))

    async def events():
        last, blocked = first, set()
        text_frame = TextFrames(shape, body.include_usage)
        frames = (
            [sse(shape.role_chunk(index, body.include_usage)) for index in range(body.n)]
            if shape.chat
            else []
        )
        # Left after the last frame was sent, or when the client left.
        async with run, aclosing(told_batches(first, deltas, run.ready)) as batches:
            async for batch in batches:
                # The latest delta's running totals are the usage chunk's.
                last = batch[-1]
                for delta in shape.ready_together(batch, output_filter):
                    if delta.finish_reason == "error":
                        yield b"".join(frames) + sse(STREAM_BROKEN.body())
                        return
                    if delta.index in blocked:
                        continue
                    if shape.text_only(delta):
                        frames.append(text_frame(delta))
                        continue
                    chunk = shape.chunk(delta, body.include_usage)
                    choice = chunk["choices"][0]
                    if screen_calls(output_filter, choice, choice.get("delta", {})):
                        blocked.add(delta.index)
                    frames.append(sse(chunk))
                if frames:
                    # One write for everything that was ready together.
                    yield b"".join(frames)
                    frames = []
                    run.delivered(last.completion_tokens)
                if len(blocked) == body.n:
                    # Leaving the run closes the deltas: the engine's work stops.
                    break
            if body.include_usage:
                frames.append(sse(shape.usage_chunk(last)))
            yield b"".join(frames) + DONE

    RESPONSES.labels(route, 200).inc()
    return EventStream(events(), media_type="text/event-stream", headers=headers)
