"""The engine's Generate span shows where a request's time went: queue, prefill, decode."""

import time

import pytest
from opentelemetry import trace

from services.engine.request import SeqOutput
from services.engine.span_events import record_timeline
from tests.unit.common.span_capture import captured_spans

tracer = trace.get_tracer("test")


@pytest.fixture
def spans():
    return captured_spans()


def last_output(arrival: float, scheduled: float | None, first: float | None) -> SeqOutput:
    return SeqOutput(
        request_id="r",
        index=0,
        token_ids=[7],
        text="!",
        finish_reason="stop" if first else None,
        prompt_tokens=12,
        completion_tokens=5 if first else 0,
        cached_prompt_tokens=8,
        arrival_time=arrival,
        scheduled_time=scheduled,
        first_token_time=first,
    )


def test_the_timeline_is_events_in_order_and_phase_durations(spans):
    now = time.monotonic()
    with tracer.start_as_current_span("maas.v1.Engine/Generate"):
        record_timeline(last_output(now - 1.0, now - 0.75, now - 0.25))
    (span,) = spans.get_finished_spans()
    assert [e.name for e in span.events] == ["queued", "prefill_started", "first_token", "finished"]
    stamps = [e.timestamp for e in span.events]
    assert stamps == sorted(stamps)
    assert stamps[2] - stamps[0] == pytest.approx(0.75e9, abs=0.01e9)
    assert span.attributes["maas.engine.queue_seconds"] == pytest.approx(0.25)
    assert span.attributes["maas.engine.prefill_seconds"] == pytest.approx(0.5)
    assert span.attributes["maas.engine.decode_seconds"] == pytest.approx(0.25, abs=0.01)
    assert span.attributes["maas.engine.cached_prompt_tokens"] == 8
    assert span.attributes["maas.engine.finish_reason"] == "stop"


def test_a_request_aborted_in_the_queue_has_only_the_phases_it_reached(spans):
    now = time.monotonic()
    with tracer.start_as_current_span("maas.v1.Engine/Generate"):
        record_timeline(last_output(now - 0.5, None, None))
    (span,) = spans.get_finished_spans()
    assert [e.name for e in span.events] == ["queued", "finished"]
    assert "maas.engine.queue_seconds" not in span.attributes
    assert span.attributes["maas.engine.finish_reason"] == ""


def test_outside_a_trace_it_records_nothing(spans):
    record_timeline(last_output(time.monotonic(), None, None))
    assert spans.get_finished_spans() == ()
