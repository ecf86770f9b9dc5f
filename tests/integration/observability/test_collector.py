"""One chat request is one trace, from the HTTP request to the bill, in a real collector.

A stack of its own (the session stack exports nothing): every service inherits
OTEL_EXPORTER_OTLP_ENDPOINT at spawn and sends its spans to rotel.
"""

import asyncio
import secrets
from pathlib import Path

import openai
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig
from tests.integration.observability.collector import Collector

pytestmark = pytest.mark.slow

SERVICES = {"maas-gateway", "maas-tokenizer", "maas-router", "maas-engine", "maas-billing"}


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    rotel = pytest.importorskip("rotel")
    running = Collector(
        Path(rotel.__file__).parent / "rotel-agent", tmp_path_factory.mktemp("rotel")
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def traced_stack(collector, tmp_path_factory):
    config = StackConfig(
        state_dir=tmp_path_factory.mktemp("traced"), gateway_port=free_port(), startup_timeout=300
    )
    stack = Stack(config)
    # Children read the variables at spawn; later stacks in this session must not.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        try:
            asyncio.run(stack.start())
        except BaseException:
            stack.stop()
            raise
    yield stack
    stack.stop()


def test_one_chat_request_is_one_trace_across_all_five_services(traced_stack, collector):
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    client = openai.OpenAI(
        base_url=f"{traced_stack.gateway_url}/v1",
        api_key=traced_stack.api_key,
        default_headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
    )
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=4,
        stream=True,
    )
    request_id = {chunk.id for chunk in stream}.pop()

    def complete(got) -> bool:
        # Spans arrive as each process's batch flushes; the gateway's HTTP span ends last.
        return {s.service for s in got} >= SERVICES and caller_span in {s.parent_id for s in got}

    spans = collector.wait_for(trace_id, complete, timeout=30)

    assert {s.service for s in spans} >= SERVICES, spans
    by_id = {s.span_id: s for s in spans}

    def ancestors(span) -> list:
        chain = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            chain.append(span)
        return chain

    (http,) = [s for s in spans if s.parent_id == caller_span]
    assert (http.service, http.name) == ("maas-gateway", "POST /v1/chat/completions")
    assert http.attributes["maas.request_id"] == request_id
    assert "first_chunk" in http.events
    # One tree: every other span descends from the gateway's HTTP span.
    assert all(http in ancestors(s) for s in spans if s is not http)
    (generate,) = [s for s in spans if s.service == "maas-engine"]
    assert generate.name == "maas.v1.Engine/Generate"
    assert generate.events == ("queued", "prefill_started", "first_token", "finished")
    assert generate.attributes["maas.engine.completion_tokens"] >= 1
    # Between the gateway and the engine: the gateway's CLIENT span of the call.
    assert by_id[generate.parent_id].name == "maas.v1.Engine/Generate"
    (commit,) = [s for s in spans if s.service == "maas-billing"]
    assert commit.attributes["maas.request_id"] == request_id
