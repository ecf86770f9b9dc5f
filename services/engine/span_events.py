"""The engine's part of a request's trace: its timeline on the Generate span.

The model runs on the engine thread, which never touches spans; the asyncio
side draws the timeline from the timestamps the request's last output carries:
queued -> prefill_started -> first_token -> finished, with the queue, prefill
and decode durations as attributes, so a slow request shows which phase ate
the time.
"""

import time

from opentelemetry import trace

from maas_services.common.tracing import wall_time_ns
from maas_services.engine.request import SeqOutput


def _between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def record_timeline(last: SeqOutput) -> None:
    span = trace.get_current_span()
    if not span.is_recording():
        return
    finished = time.monotonic()
    marks = [
        ("queued", last.arrival_time),
        ("prefill_started", last.scheduled_time),
        ("first_token", last.first_token_time),
        ("finished", finished),
    ]
    for name, at in marks:
        if at is not None:
            span.add_event(name, timestamp=wall_time_ns(at))
    durations = {
        "maas.engine.queue_seconds": _between(last.arrival_time, last.scheduled_time),
        "maas.engine.prefill_seconds": _between(last.scheduled_time, last.first_token_time),
        "maas.engine.decode_seconds": _between(last.first_token_time, finished),
    }
    span.set_attributes({k: v for k, v in durations.items() if v is not None})
    span.set_attributes(
        {
            "maas.engine.prompt_tokens": last.prompt_tokens,
            "maas.engine.cached_prompt_tokens": last.cached_prompt_tokens,
            "maas.engine.completion_tokens": last.completion_tokens,
            "maas.engine.finish_reason": last.finish_reason or "",
        }
    )
