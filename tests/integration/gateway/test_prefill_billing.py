"""A client that leaves before its first token pays for the prefill the engine did.

A real engine process (the real model, chunked prefill of 32 tokens a step, so
a long prompt spans many steps), real Redis, the gateway's pipeline in the
test's loop.
"""

import asyncio
import uuid

import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from tests.integration.gateway.conftest import MODEL, parsed

pytestmark = pytest.mark.slow

CHUNK = 32
# Sixty steps of prefill: the client leaves, and the abort lands, well before the end.
PROMPT = list(range(1000, 1000 + 60 * CHUNK))


@pytest.fixture(scope="module")
def engine_address(tmp_path_factory):
    port = free_port()
    flags = {
        "port": port,
        "metrics-port": free_port(),
        "model-id": MODEL,
        "dtype": "float32",
        "max-num-seqs": 2,
        "max-num-batched-tokens": CHUNK,
        # Room for test_first_token_timeout_billing's 6,400-token prompt whatever the weights
        # take of the test budget (bf16 copies on an AVX512-BF16 CPU leave ~3,400 slots).
        "kv-cache-memory": 400 * 1024**2,
    }
    process = ManagedProcess(
        "engine", serve_argv("engine", flags), tmp_path_factory.mktemp("engine") / "engine.log"
    )
    process.start()
    address = f"127.0.0.1:{port}"
    asyncio.run(wait_ready(process, address, timeout=300))
    yield address
    process.stop(timeout=30)


async def until_running(address: str) -> None:
    """Until the request is in a step: from then on, at least a chunk is computed."""
    async with open_channel(address, "test") as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        while (await stub.GetLoad(engine_pb2.GetLoadRequest())).running == 0:
            await asyncio.sleep(0.01)


async def test_a_client_gone_during_prefill_is_billed_the_computed_prompt(
    make_cluster, engine_address, redis_url
):
    cluster = await make_cluster(replicas=1)
    cluster.router.endpoints[:] = [("real", engine_address, MODEL)]
    tenant = Tenant(name=f"prefill-{uuid.uuid4().hex[:8]}", tpm=10_000_000)
    cluster.tokenizer.max_model_len = 8192
    request = parsed(max_tokens=16, prompt=PROMPT, ignore_eos=True)
    deltas = (await cluster.pipeline.admit(Principal(tenant, "key_test"), request)).deltas
    first = asyncio.ensure_future(anext(deltas))
    await until_running(engine_address)
    first.cancel()  # the client disconnects
    await asyncio.gather(first, return_exceptions=True)
    await cluster.pipeline.background.wait()

    event, charged, window = await billed(redis_url, tenant.name, request.request_id)
    # Whole chunks of a prompt no cache had (a new tenant), and not all of them.
    assert 0 < event.prompt_tokens < len(PROMPT)
    assert event.prompt_tokens % CHUNK == 0
    assert (event.cached_prompt_tokens, event.completion_tokens) == (0, 0)
    assert (event.finish_reason, event.tenant) == ("client_disconnect", tenant.name)
    # The TPM window holds what was billed, not the reservation, not zero.
    assert int(charged) == int(window) == event.prompt_tokens
    # And the engine stopped: nothing of the request is left running.
    async with open_channel(engine_address, "test") as channel:
        load = await engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest())
    assert (load.running, load.waiting) == (0, 0)


async def billed(redis_url: str, tenant: str, request_id: str) -> tuple[UsageEvent, str, str]:
    """(the request's one usage event, the tokens its TPM entry holds, the window's sum)."""
    redis = open_redis(redis_url)
    try:
        entries = await redis.xrange(USAGE_STREAM)
        charged = await redis.hget(f"maas:rl:{{{tenant}}}:tokens", request_id)
        window = await redis.get(f"maas:rl:{{{tenant}}}:sum")
    finally:
        await redis.aclose()
    (event,) = [
        UsageEvent.from_fields(fields)
        for _, fields in entries
        if fields.get("request_id") == request_id  # other tests share this stream
    ]
    return event, charged, window
