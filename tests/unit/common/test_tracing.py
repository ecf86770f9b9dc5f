"""Trace context crosses gRPC hops: a CLIENT span per call, the callee's SERVER span under it."""

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from maas_services.common.grpc_interceptors import ServerInterceptor, client_interceptors
from maas_services.common.tracing import (
    context_from_traceparent,
    current_traceparent,
    tracer_provider,
    wall_time_ns,
)
from tests.unit.common.span_capture import captured_spans

tracer = trace.get_tracer("test")


@pytest.fixture
def spans():
    return captured_spans()


async def say(request: bytes, context) -> bytes:
    codes = {b"fail": grpc.StatusCode.INTERNAL, b"bad": grpc.StatusCode.INVALID_ARGUMENT}
    if request in codes:
        await context.abort(codes[request], request.decode())
    if request == b"crash":
        raise RuntimeError("a bug")
    return request


async def count(request: bytes, context):
    for i in range(3):
        yield bytes([i])


async def wait(request: bytes, context):
    yield b"first"
    await asyncio.sleep(30)


@pytest.fixture
async def channel():
    server = grpc.aio.server(interceptors=[ServerInterceptor("tracetest")])
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.Echo",
                {
                    "Say": grpc.unary_unary_rpc_method_handler(say),
                    "Count": grpc.unary_stream_rpc_method_handler(count),
                    "Wait": grpc.unary_stream_rpc_method_handler(wait),
                },
            )
        ]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", interceptors=client_interceptors("tracetestclient")
    ) as chan:
        yield chan
    await server.stop(None)


async def finished(spans, count: int) -> list:
    """The finished spans once there are `count` (a stream's client span ends in a callback)."""
    for _ in range(100):
        if len(spans.get_finished_spans()) >= count:
            break
        await asyncio.sleep(0.01)
    return list(spans.get_finished_spans())


def by_kind(got: list) -> dict:
    return {s.kind: s for s in got}


async def test_a_call_in_a_trace_is_a_client_span_with_the_server_span_under_it(channel, spans):
    with tracer.start_as_current_span("caller") as caller:
        assert await channel.unary_unary("/test.Echo/Say")(b"hi") == b"hi"
    got = by_kind(await finished(spans, 3))
    client, server = got[SpanKind.CLIENT], got[SpanKind.SERVER]
    assert client.name == server.name == "test.Echo/Say"
    assert client.parent.span_id == caller.get_span_context().span_id
    assert server.parent.span_id == client.context.span_id
    assert server.context.trace_id == caller.get_span_context().trace_id
    assert server.attributes["rpc.method"] == "test.Echo/Say"
    assert server.attributes["rpc.response.status_code"] == "OK"
    assert client.status.status_code == server.status.status_code == StatusCode.UNSET


async def test_a_call_outside_any_trace_starts_one(channel, spans):
    await channel.unary_unary("/test.Echo/Say")(b"hi")
    got = by_kind(await finished(spans, 2))
    assert got[SpanKind.CLIENT].parent is None
    assert got[SpanKind.SERVER].context.trace_id == got[SpanKind.CLIENT].context.trace_id


@pytest.mark.parametrize(
    ("payload", "code", "server_status"),
    [(b"fail", "INTERNAL", StatusCode.ERROR), (b"bad", "INVALID_ARGUMENT", StatusCode.UNSET)],
)
async def test_a_failed_call_is_an_error_for_the_caller_and_for_a_failing_server(
    channel, spans, payload, code, server_status
):
    with pytest.raises(grpc.aio.AioRpcError):
        await channel.unary_unary("/test.Echo/Say")(payload)
    got = by_kind(await finished(spans, 2))
    assert got[SpanKind.CLIENT].status.status_code == StatusCode.ERROR
    assert got[SpanKind.SERVER].status.status_code == server_status
    assert got[SpanKind.SERVER].attributes["rpc.response.status_code"] == code
    assert got[SpanKind.CLIENT].attributes["error.type"] == code


async def test_a_crashing_handler_leaves_its_exception_on_the_server_span(channel, spans):
    with pytest.raises(grpc.aio.AioRpcError):
        await channel.unary_unary("/test.Echo/Say")(b"crash")
    server = by_kind(await finished(spans, 2))[SpanKind.SERVER]
    assert server.status.status_code == StatusCode.ERROR
    assert server.attributes["rpc.response.status_code"] == "UNKNOWN"
    assert [e.attributes["exception.message"] for e in server.events] == ["a bug"]


async def test_a_streaming_call_is_timed_to_its_last_message(channel, spans):
    with tracer.start_as_current_span("caller"):
        call = channel.unary_stream("/test.Echo/Count")(b"")
        messages = [m async for m in call]
    assert messages == [b"\x00", b"\x01", b"\x02"]
    got = by_kind(await finished(spans, 3))
    client, server = got[SpanKind.CLIENT], got[SpanKind.SERVER]
    assert server.parent.span_id == client.context.span_id
    assert client.end_time >= server.end_time


async def test_a_caller_that_cancels_is_not_a_server_failure(channel, spans):
    call = channel.unary_stream("/test.Echo/Wait")(b"")
    assert await call.read() == b"first"
    call.cancel()
    server = by_kind(await finished(spans, 2))[SpanKind.SERVER]
    assert server.attributes["rpc.response.status_code"] == "CANCELLED"
    assert server.status.status_code == StatusCode.UNSET


async def test_polls_are_traced_only_inside_a_trace(channel, spans):
    check = health_pb2_grpc.HealthStub(channel).Check
    await check(health_pb2.HealthCheckRequest())
    await asyncio.sleep(0.05)
    assert spans.get_finished_spans() == ()
    with tracer.start_as_current_span("caller"):
        await check(health_pb2.HealthCheckRequest())
    assert {s.kind for s in await finished(spans, 3)} == {
        SpanKind.INTERNAL,
        SpanKind.CLIENT,
        SpanKind.SERVER,
    }


def test_traceparent_carries_the_current_span_and_brings_it_back(spans):
    assert current_traceparent() == ""
    with tracer.start_as_current_span("request") as span:
        header = current_traceparent()
    ids = span.get_span_context()
    assert header.startswith(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-")
    assert int(header[-2:], 16) & 1  # sampled
    parent = trace.get_current_span(context_from_traceparent(header)).get_span_context()
    assert (parent.trace_id, parent.span_id, parent.is_remote) == (ids.trace_id, ids.span_id, True)
    empty = trace.get_current_span(context_from_traceparent("")).get_span_context()
    assert not empty.is_valid


def test_monotonic_readings_become_epoch_nanoseconds():
    ten_seconds_ago = wall_time_ns(time.monotonic() - 10)
    assert abs(time.time_ns() - 10e9 - ten_seconds_ago) < 0.1e9


def test_without_an_exporter_spans_get_ids_and_record_nothing(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    span = tracer_provider("test").get_tracer("t").start_span("request")
    assert not span.is_recording()
    assert span.get_span_context().is_valid
    with trace.use_span(span):
        assert current_traceparent().split("-")[1] == f"{span.get_span_context().trace_id:032x}"


def test_an_exporter_or_a_sampler_asked_for_records_spans(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    assert tracer_provider("test").get_tracer("t").start_span("request").is_recording()
    monkeypatch.delenv("OTEL_TRACES_SAMPLER")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    provider = tracer_provider("test")
    try:
        assert provider.get_tracer("t").start_span("request").is_recording()
    finally:
        provider.shutdown()


async def test_what_the_server_interceptor_keeps_is_bounded_by_its_methods():
    interceptor = ServerInterceptor("boundtest")
    server = grpc.aio.server(interceptors=[interceptor])
    handlers = {"Say": grpc.unary_unary_rpc_method_handler(say)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
            for i in range(20):
                assert await chan.unary_unary("/test.Echo/Say")(b"hi") == b"hi"
                with pytest.raises(grpc.aio.AioRpcError):
                    await chan.unary_unary("/test.Echo/Say")(b"bad")
                # A caller's made-up method names are never kept.
                with pytest.raises(grpc.aio.AioRpcError) as unknown:
                    await chan.unary_unary(f"/test.Echo/Made{i}")(b"hi")
                assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
    assert list(interceptor._calls._methods) == ["/test.Echo/Say"]
    assert len(interceptor._wrapped) == 1
    assert len(interceptor._calls._record._children) == 2  # OK and INVALID_ARGUMENT
