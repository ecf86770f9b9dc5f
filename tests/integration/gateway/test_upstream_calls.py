"""The gateway's calls to its peers: what the client interceptors gave them, for fewer tasks.

Upstreams' channels have no grpc.aio interceptors (upstreams.py): each call
still carries the service token, gets its CLIENT span in the request's trace
and its client metrics, and a unary call runs in the one task grpc.aio gives
every call.
"""

import asyncio
import threading

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import REGISTRY

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common.service_token import ENV, METADATA_KEY
from maas_services.gateway.upstream.upstreams import Upstreams
from tests.integration.gateway.stubs import StubRouter, start
from tests.integration.gateway.task_count import tasks_created
from tests.unit.common.span_capture import captured_spans

tracer = trace.get_tracer("test")


class TokenRouter(StubRouter):
    """Keeps the service token each Pick carried."""

    def __init__(self, endpoints):
        super().__init__(endpoints)
        self.tokens: list[str] = []

    async def Pick(self, request, context):
        sent = dict(context.invocation_metadata())
        self.tokens.append(sent.get(METADATA_KEY, ""))
        return await super().Pick(request, context)


@pytest.fixture
async def router(monkeypatch):
    """A router servicer on a loop of its own (its tasks are not the client's) and Upstreams."""
    monkeypatch.setenv(ENV, "the-release-token")
    servicer = TokenRouter([("e0", "127.0.0.1:1", "m")])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, address = asyncio.run_coroutine_threadsafe(
        start(servicer, router_pb2_grpc.add_RouterServicer_to_server), loop
    ).result(30)
    upstreams = Upstreams("127.0.0.1:1", address)
    yield servicer, upstreams
    await upstreams.close()
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def handled(method: str, code: str) -> float:
    labels = {"grpc_service": "maas.v1.Router", "grpc_method": method, "grpc_code": code}
    return REGISTRY.get_sample_value("maas_gateway_grpc_client_handled_total", labels) or 0.0


PICK = router_pb2.PickRequest(request_id="r", model="m", token_ids=[1, 2, 3])


async def test_a_call_carries_the_token_and_its_span_and_is_counted(router):
    servicer, upstreams = router
    spans = captured_spans()
    before = handled("Pick", "OK")
    with tracer.start_as_current_span("request") as request:
        picked = await upstreams.router.Pick(PICK, timeout=5)
    assert picked.endpoint_id == "e0"
    assert servicer.tokens == ["the-release-token"]
    assert handled("Pick", "OK") - before == 1
    (span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert span.name == "maas.v1.Router/Pick"
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.attributes["rpc.method"] == "maas.v1.Router/Pick"
    assert span.attributes["rpc.response.status_code"] == "OK"


async def test_a_failed_call_is_counted_with_its_code(router):
    _, upstreams = router
    before = handled("Pick", "UNAVAILABLE")
    with pytest.raises(grpc.aio.AioRpcError):
        await upstreams.router.Pick(router_pb2.PickRequest(request_id="r", model="none"))
    assert handled("Pick", "UNAVAILABLE") - before == 1


async def test_a_unary_call_makes_only_the_task_grpc_gives_every_call(router):
    _, upstreams = router
    await upstreams.router.Pick(PICK, timeout=5)  # connected, method resolved
    with tasks_created() as created:
        await upstreams.router.Pick(PICK, timeout=5)
        for _ in range(5):  # what the call's end schedules runs too
            await asyncio.sleep(0)
    # Intercepted, it was three: the interceptor's, the call's, and one reading
    # its status to count it.
    assert len(created) == 1
