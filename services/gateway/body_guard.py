"""ASGI middleware: refuse bodies the API should never parse.

POST bodies are read here, before any route: over `max_bytes` -> 413 (checked
against Content-Length first, then while reading, so a chunked upload is cut
off too), not JSON -> 415, not UTF-8 -> 400. The body is then replayed to the
app; later receive() calls go to the server, so disconnects still arrive.
"""

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.errors import APIError


def _error(status: int, message: str, code: str) -> APIError:
    return APIError(status, message, code=code)


class BodyGuard:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except APIError as error:
            await self._refuse(send, error)
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
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _error(400, "The client went away before sending the body.", "disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _error(
                400, f"The body is not valid UTF-8 (byte {exc.start}).", "invalid_encoding"
            ) from None
        return body

    def _too_large(self) -> APIError:
        return _error(
            413, f"The request body is larger than {self._max} bytes.", "request_too_large"
        )

    async def _refuse(self, send: Send, error: APIError) -> None:
        payload = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
