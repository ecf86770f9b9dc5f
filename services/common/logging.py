"""Structured logs: one JSON object per line on stderr, via structlog.

Standard-library loggers (uvicorn, grpc, redis) are routed through the same
processors so a service never mixes formats. A line written while a span is
current carries that span's `trace_id` and `span_id`, so a log search can jump
to the trace and back.
"""

import logging
import sys

import structlog
from opentelemetry import trace


def add_trace_ids(logger, method: str, event: dict) -> dict:
    """Add the current span's ids in OTel's hex format; nothing outside a span.

    An unsampled span still has valid ids that propagate to the next hop, so its
    lines get them too: they join the logs of one request across services.
    """
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = trace.format_trace_id(ctx.trace_id)
        event["span_id"] = trace.format_span_id(ctx.span_id)
    return event


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    shared: list = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        # The level first: a dropped debug line would otherwise run every processor
        # (the timestamp among them) before the stdlib logger refused it.
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
