"""A log line carries the ids of the span it was written in, and none outside one."""

import json
import logging

import structlog
from opentelemetry.sdk.trace import TracerProvider

from maas_services.common.logging import configure_logging


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]


def test_a_line_inside_a_span_carries_its_ids_and_one_outside_none(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level, structlog.get_config()
    tracer = TracerProvider().get_tracer("test")
    try:
        configure_logging("test", level="info")
        log = structlog.get_logger("test_logging_trace_ids")
        with tracer.start_as_current_span("work") as span:
            log.info("inside")
            logging.getLogger("stdlib").warning("stdlib inside")
        log.info("outside")
        inside, stdlib_inside, outside = _lines(capsys)
    finally:
        root.handlers[:], level, config = saved
        root.setLevel(level)
        structlog.configure(**config)
        structlog.contextvars.clear_contextvars()
    ids = span.get_span_context()
    expected = {"trace_id": f"{ids.trace_id:032x}", "span_id": f"{ids.span_id:016x}"}
    assert {k: inside[k] for k in expected} == expected
    assert {k: stdlib_inside[k] for k in expected} == expected
    assert "trace_id" not in outside and "span_id" not in outside
