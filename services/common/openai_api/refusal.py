"""Answering with an OpenAI error before the app runs (ASGI middleware, the HTTP protocol).

A middleware's refusal may go out while the client is still sending the body;
the connection stays open, so the client can read the answer (closing a socket
with unread input resets it, and the client's TCP stack drops the answer),
while uvicorn discards the rest of the body unbuffered and the protocol's
header deadline (http_protocol.py) ends a connection that keeps sending. The
protocol's own refusals close the connection at once.
"""

import json
from http import HTTPStatus

from starlette.types import Send

from maas_services.common.openai_api.errors import APIError


def _headers(error: APIError, payload: bytes) -> list[tuple[bytes, bytes]]:
    extra = [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *extra,
    ]


async def refuse(send: Send, error: APIError) -> None:
    payload = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": _headers(error, payload),
        }
    )
    await send({"type": "http.response.body", "body": payload})


def raw_response(error: APIError) -> bytes:
    """The whole HTTP/1.1 response, for a protocol that writes to the socket itself."""
    payload = json.dumps(error.body()).encode()
    status = f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n".encode()
    headers = [*_headers(error, payload), (b"connection", b"close")]
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return status + lines + b"\r\n" + payload
