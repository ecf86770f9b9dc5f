"""ASGI middleware: refuse bodies the API should never parse, and read the rest within budget.

POST bodies are read here, after AuthGate and before any route: over
`max_bytes` -> 413 (checked against Content-Length first, then while reading,
so a chunked upload is cut off too), not JSON -> 415, not sent within
`read_timeout` seconds -> 408 (a slow body must not hold a connection and
its buffer forever), not UTF-8 -> 400, too many JSON items -> 400
(body_shape.py). The body is then replayed to the app; later receive() calls
go to the server, so disconnects still arrive.

Before a byte is read, its room is reserved in the tenant's byte budget
(body_budget.py; AuthGate left the principal in the scope's state): the
whole Content-Length at once, or each chunk of a chunked upload as it comes
(uvicorn pauses reading a connection with 64 KiB unread, so a waiting body
holds that plus one socket read, at most 256 KiB, here). No room within the
budget's wait -> 429 for a tenant over its own share, 503 for a replica over
its total. The lease is left in the scope's state as `body_lease`: the route
releases it once the request is parsed (routes/deps.release_body), and this
releases it at the latest when the app returns. The bytes are not kept here
once replayed.
"""

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maas_services.common.openai_api.body_shape import check_shape
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.refusal import refuse
from maas_services.gateway.admission.body_budget import BodyBudget, BodyLease

LEASE = "body_lease"


def _error(status: int, message: str, code: str) -> APIError:
    return APIError(status, message, code=code)


class BodyGuard:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float, budget: BodyBudget):
        self._app = app
        self._max = max_bytes
        self._read_timeout = read_timeout
        self._budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        lease = self._budget.lease(state["principal"].tenant)
        try:
            await self._guarded(scope, receive, send, lease)
        finally:
            lease.release()

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, lease: BodyLease):
        try:
            body = await self._read(scope, receive, lease)
            check_shape(body)
        except APIError as error:
            lease.release()  # before the answer, whose send may wait on the client
            await refuse(send, error)
            return
        scope["state"][LEASE] = lease

        async def replay() -> Message:
            nonlocal body
            if body is None:
                return await receive()
            # Handed over once, and not kept: the app drops it when parsed.
            message = {"type": "http.request", "body": body, "more_body": False}
            body = None
            return message

        await self._app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive, lease: BodyLease) -> bytes:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise _error(
                415,
                f"Content-Type must be application/json, not {media_type or 'missing'!r}.",
                "unsupported_media_type",
            )
        declared = headers.get("content-length", "")
        declared = int(declared) if declared.isdigit() else None
        if declared is not None and declared > self._max:
            raise self._too_large()
        if declared is not None:
            await lease.grow(declared)
        try:
            async with asyncio.timeout(self._read_timeout):
                body = await self._receive_all(receive, lease, declared is None)
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

    async def _receive_all(self, receive: Receive, lease: BodyLease, per_chunk: bool) -> bytes:
        # Chunks joined once at the end: a growing bytearray would be copied as it grows.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _error(400, "The client went away before sending the body.", "disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                raise self._too_large()
            if per_chunk and chunk:
                # The next read waits until this one fits.
                await lease.grow(len(chunk))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self) -> APIError:
        return _error(
            413, f"The request body is larger than {self._max} bytes.", "request_too_large"
        )
