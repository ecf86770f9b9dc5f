"""The engine's Generate span shows where a request's time went (queue, prefill, decode)
and, in the GenAI conventions, what was generated."""

import time
from types import SimpleNamespace

import pytest
from opentelemetry import trace

from maas.v1 import engine_pb2
from maas_services.engine.request import SeqOutput
from maas_services.engine.servicer import EngineServicer
from maas_services.engine.span_events import record_timeline
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


class TwoSamples:
    """An AsyncEngine stand-in: a request with n=2, one token each, finished differently."""

    info = SimpleNamespace(max_model_len=64)

    async def generate(self, request_id, prompt, params, *args, on_scheduled=None):
        for index, reason in ((0, "stop"), (1, "length")):
            yield SeqOutput(request_id, index, [5, 6], "hi", reason, len(prompt), 2, 0)


async def test_the_generate_span_carries_the_gen_ai_attributes(spans):
    servicer = EngineServicer("m", "e0", TwoSamples(), tokenizer=None)
    request = engine_pb2.GenerateRequest(
        request_id="r",
        model="m",
        prompt_token_ids=[1, 2, 3],
        sampling=engine_pb2.SamplingParams(n=2, max_tokens=2, temperature=0.5),
    )
    with tracer.start_as_current_span("maas.v1.Engine/Generate"):
        responses = [r async for r in servicer.Generate(request, context=None)]
    assert len(responses) == 2
    (span,) = spans.get_finished_spans()
    assert {k: v for k, v in span.attributes.items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.request.model": "m",
        "gen_ai.request.max_tokens": 2,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.response.model": "m",
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.response.finish_reasons": ("stop", "length"),
    }
