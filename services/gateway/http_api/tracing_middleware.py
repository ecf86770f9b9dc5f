"""ASGI middleware: the HTTP request as the client sees it, on its span and in metrics.

FastAPI (0.142 and later) opens each request's SERVER span itself, from the
caller's W3C `traceparent`, once a tracer provider is configured; this adds
what only the gateway knows: the request id and the moment the first body
chunk of a stream leaves, the client's first token. With an older FastAPI or
its tracing off, it opens the span itself. Either way the span stays current
while the response streams, so the tokenizer, router and engine calls and the
usage event all join it. Probes are not timed here: they would drown the
requests.
"""

import time
from contextlib import nullcontext

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from maas_services.common.metrics import LATENCY_BUCKETS

UNOBSERVED = frozenset({"/healthz", "/health", "/readyz"})

E2E_SECONDS = Histogram(
    "maas_gateway_e2e_request_latency_seconds",
    "From the request's arrival to its last response byte, by route and status class",
    ["route", "status_class"],
    buckets=LATENCY_BUCKETS,
)
TTFT_SECONDS = Histogram(
    "maas_gateway_time_to_first_token_seconds",
    "From a streamed request's arrival to its first body chunk",
    ["route"],
    buckets=LATENCY_BUCKETS,
)

tracer = trace.get_tracer("maas.gateway")


def _route(scope: Scope) -> str:
    """The matched route's template; unmatched paths share one label value."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def _own_span(scope: Scope):
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return tracer.start_as_current_span(
        scope["method"],
        context=propagate.extract(headers),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
    )


class TracingMiddleware:
    def __init__(self, app: ASGIApp):
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNOBSERVED:
            await self._app(scope, receive, send)
            return
        framework = trace.get_current_span()
        own = not framework.is_recording()
        with _own_span(scope) if own else nullcontext(framework) as span:
            await self._observe(scope, receive, send, span, own)

    async def _observe(self, scope: Scope, receive: Receive, send: Send, span: Span, own: bool):
        started = time.perf_counter()
        status, first_chunk, streaming = 500, None, False

        async def observed_send(message: Message) -> None:
            nonlocal status, first_chunk, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                sent = dict(message.get("headers") or ())
                streaming = sent.get(b"content-type", b"").startswith(b"text/event-stream")
                request_id = sent.get(b"x-request-id")
                if request_id:
                    span.set_attribute("maas.request_id", request_id.decode("latin-1"))
            elif message.get("body") and first_chunk is None:
                first_chunk = time.perf_counter()
                span.add_event("first_chunk")
            await send(message)

        try:
            await self._app(scope, receive, observed_send)
        finally:
            route = _route(scope)
            if own:
                span.update_name(f"{scope['method']} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR, str(status)))
            E2E_SECONDS.labels(route, f"{status // 100}xx").observe(time.perf_counter() - started)
            if streaming and first_chunk is not None:
                TTFT_SECONDS.labels(route).observe(first_chunk - started)
