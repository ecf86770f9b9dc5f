"""gRPC interceptors: Prometheus metrics and OpenTelemetry spans on both sides.

The server side wraps each handler's behaviour so streaming methods are timed
to their last message, not to the first yield.
"""

import asyncio
import time

import grpc
from opentelemetry import trace

from services.common.metrics import grpc_metrics
from services.common.tracing import extract_context, inject_metadata


def _split(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service, method


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service: str):
        self._metrics = grpc_metrics(service, "server")
        self._tracer = trace.get_tracer(f"maas.{service}")

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        grpc_service, method = _split(handler_call_details.method)
        parent = extract_context(handler_call_details.invocation_metadata)
        span_name = f"{grpc_service}/{method}"
        metrics, tracer = self._metrics, self._tracer

        def observe(code: grpc.StatusCode, started: float) -> None:
            labels = (grpc_service, method, code.name)
            metrics.handled.labels(*labels).inc()
            metrics.latency.labels(*labels).observe(time.perf_counter() - started)

        def code_of(ctx, error: BaseException | None) -> grpc.StatusCode:
            if error is not None and not isinstance(error, grpc.aio.AbortError):
                return grpc.StatusCode.UNKNOWN
            return ctx.code() or grpc.StatusCode.OK

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request, ctx):
                started, error = time.perf_counter(), None
                with tracer.start_as_current_span(
                    span_name, context=parent, kind=trace.SpanKind.SERVER
                ):
                    try:
                        return await inner(request, ctx)
                    except BaseException as exc:
                        error = exc
                        raise
                    finally:
                        observe(code_of(ctx, error), started)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def unary_stream(request, ctx):
                started, error = time.perf_counter(), None
                with tracer.start_as_current_span(
                    span_name, context=parent, kind=trace.SpanKind.SERVER
                ):
                    try:
                        async for message in inner_stream(request, ctx):
                            yield message
                    except BaseException as exc:
                        error = exc
                        raise
                    finally:
                        observe(code_of(ctx, error), started)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )
        return handler


class _ClientBase:
    def __init__(self, service: str):
        self._metrics = grpc_metrics(service, "client")

    def _details(self, details):
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            inject_metadata(list(details.metadata or ())),
            details.credentials,
            details.wait_for_ready,
        )

    def _observe(self, details, started: float, code: grpc.StatusCode) -> None:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        labels = (*_split(method), code.name)
        self._metrics.handled.labels(*labels).inc()
        self._metrics.latency.labels(*labels).observe(time.perf_counter() - started)


class UnaryUnaryClientInterceptor(_ClientBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        details, started = self._details(client_call_details), time.perf_counter()
        call = await continuation(details, request)
        try:
            await call
        finally:
            self._observe(details, started, await call.code())
        return call


class UnaryStreamClientInterceptor(_ClientBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        details, started = self._details(client_call_details), time.perf_counter()
        call = await continuation(details, request)
        # Timed to the stream's end: the callback fires on the call's last status.
        call.add_done_callback(lambda c: self._observe_done(details, started, c))
        return call

    def _observe_done(self, details, started: float, call) -> None:
        async def record() -> None:
            self._observe(details, started, await call.code())

        asyncio.ensure_future(record())


def client_interceptors(service: str) -> list:
    return [UnaryUnaryClientInterceptor(service), UnaryStreamClientInterceptor(service)]
