"""uvicorn's httptools protocol with the limits a public server needs before the app runs.

httptools keeps every header byte it is sent (measured: 200 MB of headers,
200 MB of RSS) and waits for headers forever, and uvicorn offers no limit for
either with httptools (h11's `h11_max_incomplete_event_size` is for h11
only); a connection that sends nothing at all is never closed either. So:

- request line and headers over `max_header_bytes` -> 431, and the
  connection closed;
- headers not complete `header_timeout` seconds after the connection opened
  or the previous response ended -> 408; this also ends a connection that
  keeps sending a body nobody reads after an early refusal (refusal.py);
- more than `max_connections` open connections -> 503 at once, before the
  new connection's request is read. uvicorn's own `limit_concurrency` counts
  the same connections but answers in plain text after reading the headers;
  this answers with an OpenAI error and reads nothing.

The body's own deadline is BodyGuard's: the app is running by then.

Each connection also has a ClientWatch (disconnect.py) in its requests'
scopes, which its loss sets off: work for a client that left is cancelled
without a task per request waiting for http.disconnect. And each request's
scope carries uvicorn's own send as the extension BODY_SEND, for an SSE
stream's frames (http_stream.EventStream).
"""

from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.common.openai_api.refusal import raw_response
from maas_services.gateway.http_api.disconnect import WATCH, ClientWatch

# A request's uvicorn send, unwrapped by the middleware.
BODY_SEND = "maas.body_send"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_header_bytes: int
    header_timeout: float


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args, limits: ConnectionLimits, **kwargs):
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_timer = None
        self._watch = ClientWatch()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self._limits.max_connections:
            self._refuse(unavailable("The server has too many open connections; retry shortly."))
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        counting = self._awaiting_headers
        super().data_received(data)
        # Counted after parsing, so the chunk that completes the headers (and
        # brings the body's first bytes) is not counted: the parser has kept at
        # most one read (256 KiB) more than the limit.
        if not (counting and self._awaiting_headers) or self.transport.is_closing():
            return
        self._header_bytes += len(data)
        if self._header_bytes > self._limits.max_header_bytes:
            self._refuse(
                APIError(
                    431,
                    f"The request line and headers exceed {self._limits.max_header_bytes} bytes.",
                    code="headers_too_large",
                )
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {WATCH: self._watch}
        self._awaiting_headers = True
        self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_timer()
        super().on_headers_complete()
        # No new cycle for an upgrade (refused: ws="none").
        if self.cycle is not None and self.cycle.scope is self.scope:
            self.scope["extensions"][BODY_SEND] = self.cycle.send

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A pipelined request whose headers are in may have just started.
        if self.cycle.response_complete and not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        # After uvicorn's own: by then a send to this connection does nothing.
        super().connection_lost(exc)
        self._watch.lost()

    def _arm_header_timer(self) -> None:
        # Cancelled only when a request's headers are complete.
        self._cancel_timer()
        self._header_timer = self.loop.call_later(self._limits.header_timeout, self._too_slow)

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self._refuse(
                APIError(
                    408,
                    f"The request headers were not sent within {self._limits.header_timeout:g}"
                    " seconds.",
                    code="request_timeout",
                )
            )

    def _cancel_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, error: APIError) -> None:
        self._awaiting_headers = False
        self._cancel_timer()
        self.transport.write(raw_response(error))
        self.transport.close()
