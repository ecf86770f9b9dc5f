"""The spans code under test finishes, caught in memory.

The global tracer provider can be set once per process, so the exporter is
added to whichever SDK provider is there (or to one installed here) and
shared; each test clears it first.
"""

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def _shared_exporter() -> InMemorySpanExporter:
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return _exporter


def captured_spans() -> InMemorySpanExporter:
    """The exporter, emptied of earlier tests' spans."""
    exporter = _shared_exporter()
    exporter.clear()
    return exporter
