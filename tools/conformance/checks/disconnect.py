"""A client that goes away mid-stream stops its generation.

The reference's streams end when the client closes the connection; a server
that generates on for nobody spends capacity every other caller waits for.
A client can see it only where the server publishes how many requests it is
running (Prometheus text at --metrics-url): vLLM's `vllm:num_requests_running`,
llama.cpp's `llamacpp:requests_processing`, maas's engine
`maas_engine_requests_running`, or the gauge --running-metric names. The check
opens a long stream, waits until the gauge counts it, closes the connection,
and expects the gauge back at its earlier value within DEADLINE seconds.
"""

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import NotOffered, expect
from maas_tools.conformance.shapes import LONG_ANSWER
from maas_tools.conformance.target import Target

KNOWN = (
    "vllm:num_requests_running",
    "llamacpp:requests_processing",
    "maas_engine_requests_running",
)
DEADLINE = 15.0
POLL = 0.1


def running(url: str, names: tuple[str, ...]) -> tuple[str, float] | None:
    """(name, sum over its labels) of the first of `names` the metrics text has."""
    reply = httpx.get(url, timeout=10)
    if reply.status_code != 200:
        raise NotOffered(f"{url}: HTTP {reply.status_code}")
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(reply.text):
            for sample in family.samples:
                if sample.name in names:
                    found[sample.name] = found.get(sample.name, 0.0) + sample.value
    except ValueError as exc:
        raise NotOffered(f"{url} is not Prometheus text: {exc}") from exc
    return next(((n, found[n]) for n in names if n in found), None)


def wait_for(url: str, name: str, done, seconds: float) -> float | None:
    """The gauge's value once done(value) holds, None if it never did in time."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = running(url, (name,))[1]
        if done(value):
            return value
        time.sleep(POLL)
    return None


@check("disconnect", "stops_generation")
def stops_generation(target: Target) -> str:
    url = target.options.metrics_url
    if not url:
        raise NotOffered("no --metrics-url to read a running-request count from")
    names = (target.options.running_metric,) if target.options.running_metric else KNOWN
    seen = running(url, names)
    if seen is None:
        raise NotOffered(f"{url} has none of {list(names)}")
    name, before = seen
    payload = target.body(messages=LONG_ANSWER, max_tokens=2000, temperature=0, stream=True)
    with target.http.stream("POST", "/chat/completions", json=payload) as reply:
        expect(reply.status_code == 200, f"a long stream: HTTP {reply.status_code}")
        # Held, not dropped: a dropped line iterator closes the response.
        lines = reply.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                break
        counted = wait_for(url, name, lambda v: v > before, DEADLINE)
        if counted is None:
            raise NotOffered(f"{name} never counted the open stream (was {before})")
    # Leaving the block closed the connection mid-stream.
    closed = time.monotonic()
    after = wait_for(url, name, lambda v: v <= before, DEADLINE)
    expect(
        after is not None,
        f"{name} still above {before} {DEADLINE:.0f} s after the client went away",
    )
    return f"{name} {counted:g} -> {after:g} in {time.monotonic() - closed:.1f} s"
