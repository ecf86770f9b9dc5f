"""gRPC interceptors: Prometheus metrics and OpenTelemetry spans on both sides.

The server side wraps each handler's behaviour so streaming methods are timed
to their last message, not to the first yield. The client side opens a CLIENT
span per call and sends its context in the metadata, so the callee's SERVER
span is its child and a trace shows the time each hop spent on the wire apart
from the time the callee spent working. The client side also sends the service
token (maas_services.common.service_token) with every call, when it has one.

Spans carry the stable RPC semantic conventions: `rpc.system.name`, the
fully-qualified `rpc.method` ("maas.v1.Router/Pick"), the status code's name
in `rpc.response.status_code`, and `error.type` when the code is a failure for
that side.
"""

import asyncio
import contextlib
import inspect
import time
from dataclasses import dataclass

import grpc
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from maas_services.common.metrics import grpc_metrics
from maas_services.common.service_token import METADATA_KEY
from maas_services.common.tracing import extract_context, inject_metadata

# Polled or process-long calls: a root trace for each poll would bury the
# requests' traces, so these get spans only inside a request's trace.
QUIET_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/maas.v1.Engine/GetLoad",
        # The gateway's connection to an engine: its calls get their own spans.
        "/maas.v1.Engine/GenerateMany",
        "/maas.v1.Engine/StreamKvEvents",
        "/maas.v1.Router/GetPoolStats",
    }
)
# The codes that mean the server failed (OpenTelemetry's gRPC conventions);
# the others are the caller's doing and leave a server span's status unset.
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)

# Any status but OK is a failed call from where the caller stands.
CLIENT_ERRORS = frozenset(grpc.StatusCode) - {grpc.StatusCode.OK}


def _split(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service, method


def _traced(full_method: str, parent=None) -> bool:
    in_trace = trace.get_current_span(parent).get_span_context().is_valid
    return in_trace or full_method not in QUIET_METHODS


def _rpc_attributes(full_method: str) -> dict[str, str]:
    return {"rpc.system.name": "grpc", "rpc.method": full_method.lstrip("/")}


def _end_status(span: Span | None, code: grpc.StatusCode, errors) -> None:
    if span is None:
        return
    span.set_attribute("rpc.response.status_code", code.name)
    if code in errors:
        span.set_attribute("error.type", code.name)
        span.set_status(Status(StatusCode.ERROR, code.name))


@dataclass(frozen=True)
class _Method:
    """What a call's span and metrics need of its method, worked out once per method."""

    full: str
    attributes: dict[str, str]
    labels: tuple[str, str]

    @classmethod
    def of(cls, raw: str | bytes) -> "_Method":
        full = raw.decode() if isinstance(raw, bytes) else raw
        return cls(full, _rpc_attributes(full), _split(full))


class _Recorder:
    """Counts and times calls into labelled metric children made once per method and code."""

    def __init__(self, service: str, side: str):
        self._metrics = grpc_metrics(service, side)
        self._children: dict[tuple[str, grpc.StatusCode], tuple] = {}

    def __call__(self, method: _Method, code: grpc.StatusCode, started: float) -> None:
        children = self._children.get((method.full, code))
        if children is None:
            labels = (*method.labels, code.name)
            children = self._children[(method.full, code)] = (
                self._metrics.handled.labels(*labels),
                self._metrics.latency.labels(*labels),
            )
        children[0].inc()
        children[1].observe(time.perf_counter() - started)


class ServerCalls:
    """A served call's span and metrics: what the interceptor does to every
    call, and what a call served inside another does to itself (the calls of
    a GenerateMany stream: services/common/generate_mux.py). `ctx` needs only
    invocation_metadata() and code()."""

    def __init__(self, service: str):
        self._record = _Recorder(service, "server")
        self._tracer = trace.get_tracer(f"maas.{service}")
        self._methods: dict[str, _Method] = {}

    def method(self, full_method: str) -> _Method:
        method = self._methods.get(full_method)
        if method is None:
            method = self._methods[full_method] = _Method.of(full_method)
        return method

    def _span(self, method: _Method, parent):
        if not _traced(method.full, parent):
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(
            method.full.lstrip("/"),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=method.attributes,
            # An abort is a status, not a crash: _observe() sets what the code means.
            record_exception=False,
            set_status_on_exception=False,
        )

    def _observe(self, method: _Method, span, ctx, error, started: float) -> None:
        code = ctx.code() or grpc.StatusCode.OK
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            # The caller went away (a client disconnect, a timeout): not our failure. A
            # streaming handler learns it either way: its task cancelled, or, when grpc
            # closes the stream first, its generator closed at the yield.
            code = grpc.StatusCode.CANCELLED
        elif error is not None and not isinstance(error, grpc.aio.AbortError):
            code = grpc.StatusCode.UNKNOWN
            if span is not None:
                span.record_exception(error)
        self._record(method, code, started)
        _end_status(span, code, SERVER_ERRORS)

    @contextlib.contextmanager
    def observed(self, method: _Method, ctx):
        started, error = time.perf_counter(), None
        with self._span(method, extract_context(ctx.invocation_metadata())) as span:
            try:
                yield
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._observe(method, span, ctx, error, started)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service: str):
        # Every call paid these otherwise (~25 of a unary call's ~60 us in the
        # interceptor): its method's parsed name, its labelled metric children, and
        # a wrapped handler built anew. Keys are the server's own methods and
        # handlers (continuation found them), so the maps stay small.
        self._calls = ServerCalls(service)
        self._wrapped: dict[tuple[str, object], grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        inner = (
            handler.unary_unary
            or handler.unary_stream
            or handler.stream_unary
            or handler.stream_stream
        )
        if inner is None:
            return handler
        key = (handler_call_details.method, inner)
        wrapped = self._wrapped.get(key)
        if wrapped is None:
            wrapped = self._wrapped[key] = self._wrap(handler_call_details.method, handler)
        return wrapped

    def _wrap(self, full_method: str, handler) -> grpc.RpcMethodHandler:
        method = self._calls.method(full_method)
        observed = self._calls.observed
        # One response: unary or, for the gateway's tenant front, request-streaming
        # (grpc_front.py registers its methods so, to check a key before grpc reads
        # the message). Either way the handler is awaited once.
        single = handler.unary_unary or handler.stream_unary
        if single is not None:

            async def respond(request, ctx):
                with observed(method, ctx):
                    return await single(request, ctx)

            register = (
                grpc.unary_unary_rpc_method_handler
                if handler.unary_unary
                else grpc.stream_unary_rpc_method_handler
            )
            return register(respond, handler.request_deserializer, handler.response_serializer)
        if handler.stream_stream:
            inner_streams = handler.stream_stream

            async def stream_stream(requests, ctx):
                with observed(method, ctx):
                    async for message in inner_streams(requests, ctx):
                        yield message

            return grpc.stream_stream_rpc_method_handler(
                stream_stream, handler.request_deserializer, handler.response_serializer
            )
        inner_stream = handler.unary_stream

        async def unary_stream(request, ctx):
            with observed(method, ctx):
                async for message in inner_stream(request, ctx):
                    yield message

        async def unary_stream_writer(request, ctx):
            with observed(method, ctx):
                return await inner_stream(request, ctx)

        # A handler that writes with ctx.write (grpc's Health.Watch) is a
        # coroutine, not an async generator.
        wrapped = unary_stream if inspect.isasyncgenfunction(inner_stream) else unary_stream_writer
        return grpc.unary_stream_rpc_method_handler(
            wrapped, handler.request_deserializer, handler.response_serializer
        )


class _ClientBase:
    def __init__(self, service: str, token: str = ""):
        self._record = _Recorder(service, "client")
        self._tracer = trace.get_tracer(f"maas.{service}")
        self._credentials = [(METADATA_KEY, token)] if token else []
        # Every call of a request pays these lookups otherwise: the method's
        # parsed name, and its labelled metric children per status code.
        self._methods: dict[str | bytes, _Method] = {}

    def _method(self, raw: str | bytes) -> _Method:
        method = self._methods.get(raw)
        if method is None:
            method = self._methods[raw] = _Method.of(raw)
        return method

    def start(self, raw_method: str | bytes, metadata=None) -> tuple[list, Span | None]:
        """The call's metadata (token, trace context) and span (None for an untraced poll)."""
        method = self._method(raw_method)
        span = None
        if _traced(method.full):
            span = self._tracer.start_span(
                method.full.lstrip("/"), kind=SpanKind.CLIENT, attributes=method.attributes
            )
        ctx = trace.set_span_in_context(span) if span is not None else None
        return inject_metadata([*(metadata or ()), *self._credentials], ctx), span

    @property
    def credentials(self) -> list[tuple[str, str]]:
        """The metadata that carries the service token (empty without one)."""
        return list(self._credentials)

    def _begin(self, details) -> tuple[grpc.aio.ClientCallDetails, Span | None]:
        metadata, span = self.start(details.method, details.metadata)
        details = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return details, span

    def _observe(self, details, started: float, code: grpc.StatusCode, span) -> None:
        self.finish(details.method, started, code, span)

    def finish(self, raw_method: str | bytes, started: float, code: grpc.StatusCode, span) -> None:
        """Count and time the call (from `started`, a perf_counter reading), end its span."""
        self._record(self._method(raw_method), code, started)
        _end_status(span, code, CLIENT_ERRORS)
        if span is not None:
            span.end()


class UnaryUnaryClientInterceptor(_ClientBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        (details, span), started = self._begin(client_call_details), time.perf_counter()
        call = await continuation(details, request)
        try:
            await call
        finally:
            self._observe(details, started, await call.code(), span)
        return call


class UnaryStreamClientInterceptor(_ClientBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        (details, span), started = self._begin(client_call_details), time.perf_counter()
        call = await continuation(details, request)
        # Timed to the stream's end: the callback fires on the call's last status.
        call.add_done_callback(lambda c: self._observe_done(details, started, c, span))
        return call

    def _observe_done(self, details, started: float, call, span) -> None:
        async def record() -> None:
            self._observe(details, started, await call.code(), span)

        asyncio.ensure_future(record())


class ClientCalls(_ClientBase):
    """What the client interceptors do to a call, for a caller that calls a
    channel without them (services/gateway/upstream/upstreams.py): grpc.aio runs each
    intercepted call in a task of its own beside the call's, and reads its
    status in another, which cost a request more than its calls' own work."""


def client_interceptors(service: str, token: str = "") -> list:
    return [
        UnaryUnaryClientInterceptor(service, token),
        UnaryStreamClientInterceptor(service, token),
    ]
