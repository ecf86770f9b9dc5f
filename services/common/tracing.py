"""OpenTelemetry setup and W3C trace-context propagation.

Every service installs a TracerProvider named after itself so that spans get
real trace ids and the context crosses HTTP and gRPC hops. Spans are exported
over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT is set and the exporter package
is installed; otherwise they are created (so ids propagate) and dropped.
"""

import os

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from services.common.logging import get_logger

log = get_logger(__name__)


def configure_tracing(service: str) -> None:
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"maas-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("otlp_exporter_missing", hint="pip install opentelemetry-exporter-otlp")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def inject_metadata(metadata: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Return metadata plus the current trace context headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*metadata, *carrier.items()]


def extract_context(metadata) -> object:
    carrier = {key: value for key, value in (metadata or ()) if isinstance(value, str)}
    return propagate.extract(carrier)
