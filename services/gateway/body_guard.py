"""ASGI middleware: refuse bodies the API should never parse.

POST bodies are read here, after AuthGate and before any route: over
`max_bytes` -> 413 (checked against Content-Length first, then while reading,
so a chunked upload is cut off too), not JSON -> 415, not sent within
`read_timeout` seconds -> 408 (a slow body must not hold a connection and
its buffer forever), not UTF-8 -> 400, too many JSON items -> 400
(body_shape.py). The body is then replayed to the app; later receive() calls
go to the server, so disconnects still arrive.
"""

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.body_shape import check_shape
from services.gateway.errors import APIError
from services.gateway.refusal import refuse


def _error(status: int, message: str, code: str) -> APIError:
    return APIError(status, message, code=code)


class BodyGuard:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float):
        self._app = app
        self._max = max_bytes
        self._read_timeout = read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            check_shape(body)
        except APIError as error:
            await refuse(send, error)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise _error(
                415,
                f"Content-Type must be application/json, not {media_type or 'missing'!r}.",
                "unsupported_media_type",
            )
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max:
            raise self._too_large()
        try:
            async with asyncio.timeout(self._read_timeout):
                body = await self._receive_all(receive)
        except TimeoutError:
            raise _error(
                408,
                f"The request body was not sent within {self._read_timeout:g} seconds.",
                "request_timeout",
            ) from None
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _error(
                400, f"The body is not valid UTF-8 (byte {exc.start}).", "invalid_encoding"
            ) from None
        return body

    async def _receive_all(self, receive: Receive) -> bytes:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _error(400, "The client went away before sending the body.", "disconnected")
            body += message.get("body", b"")
            if len(body) > self._max:
                raise self._too_large()
            if not message.get("more_body", False):
                return bytes(body)

    def _too_large(self) -> APIError:
        return _error(
            413, f"The request body is larger than {self._max} bytes.", "request_too_large"
        )
