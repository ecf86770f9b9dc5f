"""A request to the vLLM backend cut short before its first token pays for its prompt.

vLLM says nothing of a prefill before a request's first token, so the rule
(docs/billing.md, "Requests cut short") bills the prompt's length, whether the
client left or the first-token timeout fired. A real vLLM server and the
adapter in front of it, the gateway's pipeline in the test's loop, real Redis.
vLLM's every sequence slot is taken by long requests first, so the one under
test waits in vLLM's queue and cannot get a token before it is cut.
"""

import asyncio
import dataclasses
import uuid

import grpc
import pytest

from maas.v1 import engine_pb2
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.engine.vllm_backend.load import parse_metrics
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import make_cluster, parsed  # noqa: F401
from tests.integration.router.conftest import eventually
from tests.integration.vllm.conftest import MAX_NUM_SEQS, MODEL_ID, generate_request

pytestmark = pytest.mark.slow

PROMPT = list(range(1000, 1600))


@pytest.fixture
async def vllm_full(stub, vllm_http):
    """Every one of vLLM's sequence slots held by a long request."""
    calls = [
        stub.Generate(
            generate_request(f"hold-{uuid.uuid4().hex}", max_tokens=1500, ignore_eos=True)
        )
        for _ in range(MAX_NUM_SEQS)
    ]
    for call in calls:
        await call.read()  # running: it has its first token
    yield
    for call in calls:
        call.cancel()


async def waiting(vllm_http) -> bool:
    return parse_metrics((await vllm_http.get("/metrics")).text).waiting >= 1


def request_for_vllm(**spec) -> ParsedRequest:
    return dataclasses.replace(parsed(prompt=PROMPT, max_tokens=8, **spec), model=MODEL_ID)


async def cluster_on(make_cluster, adapter, **settings):  # noqa: F811
    cluster = await make_cluster(replicas=1, **settings)
    cluster.router.endpoints[:] = [("vllm", adapter, MODEL_ID)]
    return cluster


async def usage_event(redis_url, request_id: str) -> UsageEvent:
    redis = open_redis(redis_url)
    try:
        entries = await redis.xrange(USAGE_STREAM)
    finally:
        await redis.aclose()
    (event,) = [
        UsageEvent.from_fields(fields)
        for _, fields in entries
        if fields.get("request_id") == request_id  # other tests share this stream
    ]
    return event


async def test_a_client_gone_before_the_first_token_is_billed_the_prompt(
    make_cluster,  # noqa: F811
    adapter,
    vllm_full,
    vllm_http,
    redis_url,
):
    cluster = await cluster_on(make_cluster, adapter)
    tenant = Tenant(name=f"gone-{uuid.uuid4().hex[:8]}")
    request = request_for_vllm()
    completion = await cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    first = asyncio.ensure_future(anext(completion.deltas))
    await eventually(lambda: waiting(vllm_http), timeout=60, what="the request waiting in vLLM")
    assert not first.done()
    first.cancel()  # the client disconnects
    await asyncio.gather(first, return_exceptions=True)
    await cluster.pipeline.background.wait()
    event = await usage_event(redis_url, request.request_id)
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), 0)
    assert (event.finish_reason, event.tenant) == ("client_disconnect", tenant.name)


async def test_a_first_token_timeout_is_billed_the_prompt(
    make_cluster,  # noqa: F811
    adapter,
    vllm_full,
    redis_url,
):
    cluster = await cluster_on(make_cluster, adapter, first_token_timeout_seconds=1.0)
    tenant = Tenant(name=f"timeout-{uuid.uuid4().hex[:8]}")
    request = request_for_vllm()
    completion = await cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    with pytest.raises(APIError) as caught:
        async for _ in completion.deltas:
            pass
    assert caught.value.status == 504
    await completion.close()
    await cluster.pipeline.background.wait()
    event = await usage_event(redis_url, request.request_id)
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), 0)
    assert event.finish_reason == "first_token_timeout"


async def test_an_abort_before_the_first_token_reports_the_prompt_computed(stub, vllm_full):
    call = stub.Generate(generate_request("abort-waiting", prompt=PROMPT, max_tokens=8))
    reading = asyncio.ensure_future(call.read())
    abort = engine_pb2.AbortRequest(request_id="abort-waiting")
    while not (await stub.Abort(abort)).found:
        await asyncio.sleep(0.01)  # until the adapter has it
    last = await reading
    assert last != grpc.aio.EOF and not last.token_ids
    assert (last.usage.prompt_tokens, last.computed_prompt_tokens) == (len(PROMPT), len(PROMPT))
