"""OpenTelemetry setup and W3C trace-context propagation.

Every service installs a TracerProvider named after itself so that spans get
real trace ids and the context crosses HTTP and gRPC hops. Spans are exported
over OTLP/gRPC only when OTEL_EXPORTER_OTLP_ENDPOINT is set (the exporter reads
the standard OTEL_* variables: endpoint, headers, timeout, OTEL_BSP_* batching);
otherwise they are not sampled: they get ids, which propagate, and record nothing.

The Redis usage stream is a hop too: the gateway puts the request's
`traceparent` into the usage event and billing continues the trace from it.
"""

import os
import time

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from maas_services.common.logging import get_logger

log = get_logger(__name__)


def configure_tracing(service: str) -> None:
    trace.set_tracer_provider(tracer_provider(service))


def tracer_provider(service: str) -> TracerProvider:
    exporter = None
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning(
                "otlp_exporter_missing", hint="pip install opentelemetry-exporter-otlp-proto-grpc"
            )
        else:
            exporter = OTLPSpanExporter()
    # With nowhere to send them, spans are not recorded (unless OTEL_TRACES_SAMPLER
    # asks): a recorded span costs its attributes, events and processor calls,
    # several per request, for nothing. Unsampled spans still get ids, which propagate.
    sampler = None if exporter or os.environ.get("OTEL_TRACES_SAMPLER") else ALWAYS_OFF
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: f"maas-{service}"}), sampler=sampler
    )
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def inject_metadata(
    metadata: list[tuple[str, str]], ctx: context.Context | None = None
) -> list[tuple[str, str]]:
    """Return metadata plus the trace context headers of `ctx` (default: the current one)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return [*metadata, *carrier.items()]


def extract_context(metadata) -> context.Context:
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    return propagate.extract(carrier)


def current_traceparent() -> str:
    """The current span as a W3C traceparent header value; "" outside any trace."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def context_from_traceparent(traceparent: str) -> context.Context:
    """A context whose parent is the span `traceparent` names (a new trace when empty)."""
    return propagate.extract({"traceparent": traceparent} if traceparent else {})


def wall_time_ns(monotonic_seconds: float) -> int:
    """A time.monotonic() reading as epoch nanoseconds, the clock span events use."""
    return time.time_ns() - int((time.monotonic() - monotonic_seconds) * 1e9)
