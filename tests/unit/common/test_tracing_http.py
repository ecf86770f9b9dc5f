"""The gateway's HTTP side: the request's span carries what the client saw, and so do metrics."""

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.routing import Route

from maas_services.gateway.http_api.tracing_middleware import TracingMiddleware
from tests.unit.common.span_capture import captured_spans

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def spans():
    return captured_spans()


async def chunks():
    yield b"data: 1\n\n"
    yield b"data: 2\n\n"


async def stream(request=None):
    return StreamingResponse(
        chunks(), media_type="text/event-stream", headers={"x-request-id": "chatcmpl-7"}
    )


async def crash(request=None):
    raise RuntimeError("a bug")


def fastapi_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(TracingMiddleware)
    app.get("/v1/stream")(stream)
    app.get("/v1/plain")(lambda: {"ok": True})
    app.get("/healthz")(lambda: {"status": "ok"})
    return app


def starlette_app() -> Starlette:
    """No framework span here (plain Starlette), as with FastAPI before 0.142."""
    app = Starlette(routes=[Route("/v1/stream", stream), Route("/v1/crash", crash)])
    app.add_middleware(TracingMiddleware)
    return app


def count(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def ttft(route: str) -> float:
    return count("maas_gateway_time_to_first_token_seconds_count", route=route)


def e2e(route: str, status_class: str) -> float:
    return count(
        "maas_gateway_e2e_request_latency_seconds_count", route=route, status_class=status_class
    )


async def get(app, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.get(path, headers={"traceparent": TRACEPARENT})


def server_span(spans):
    (span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    return span


async def test_the_frameworks_request_span_gets_the_request_id_and_first_chunk(spans):
    before_ttft, before_e2e = ttft("/v1/stream"), e2e("/v1/stream", "2xx")
    reply = await get(fastapi_app(), "/v1/stream")
    assert reply.text == "data: 1\n\ndata: 2\n\n"
    span = server_span(spans)
    assert span.name == "GET /v1/stream"
    assert (span.context.trace_id, span.parent.span_id) == (
        int(CALLER_TRACE, 16),
        int(CALLER_SPAN, 16),
    )
    assert span.attributes["maas.request_id"] == "chatcmpl-7"
    assert [e.name for e in span.events] == ["first_chunk"]
    assert ttft("/v1/stream") == before_ttft + 1
    assert e2e("/v1/stream", "2xx") == before_e2e + 1


async def test_a_whole_answer_is_timed_end_to_end_but_has_no_first_token(spans):
    before_ttft, before_e2e = ttft("/v1/plain"), e2e("/v1/plain", "2xx")
    assert (await get(fastapi_app(), "/v1/plain")).json() == {"ok": True}
    assert ttft("/v1/plain") == before_ttft
    assert e2e("/v1/plain", "2xx") == before_e2e + 1


async def test_probes_are_not_timed(spans):
    before = e2e("/healthz", "2xx")
    assert (await get(fastapi_app(), "/healthz")).status_code == 200
    assert e2e("/healthz", "2xx") == before


async def test_without_a_framework_span_it_opens_one_from_the_callers_context(spans):
    await get(starlette_app(), "/v1/stream")
    span = server_span(spans)
    assert span.name == "GET /v1/stream"
    assert span.parent.span_id == int(CALLER_SPAN, 16)
    assert span.attributes["http.response.status_code"] == 200
    assert [e.name for e in span.events] == ["first_chunk"]
    assert not trace.get_current_span().is_recording()


async def test_a_crash_is_a_5xx_and_an_error_span(spans):
    before = e2e("/v1/crash", "5xx")
    assert (await get(starlette_app(), "/v1/crash")).status_code == 500
    span = server_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert e2e("/v1/crash", "5xx") == before + 1
