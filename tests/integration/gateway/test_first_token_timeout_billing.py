"""A request cut short by the first-token timeout pays for the prefill the engine did.

A real engine process (the real model, chunked prefill, so a long prompt spans
many steps and is still in prefill when the timeout fires), real Redis, the
gateway's pipeline in the test's loop. The rule: docs/billing.md, "Requests
cut short".
"""

import uuid

import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, parsed
from tests.integration.gateway.test_prefill_billing import (  # noqa: F401 (the fixture)
    CHUNK,
    billed,
    engine_address,
)

pytestmark = pytest.mark.slow

# Two hundred steps of prefill: far more than the timeout lets run, on any CPU.
PROMPT = list(range(1000, 1000 + 200 * CHUNK))


async def test_a_first_token_timeout_bills_the_prompt_the_engine_computed(
    make_cluster,
    engine_address,  # noqa: F811
    redis_url,
):
    cluster = await make_cluster(replicas=1, first_token_timeout_seconds=1.0)
    cluster.router.endpoints[:] = [("real", engine_address, MODEL)]
    cluster.tokenizer.max_model_len = 8192
    tenant = Tenant(name=f"timeout-{uuid.uuid4().hex[:8]}", tpm=10_000_000)
    request = parsed(max_tokens=16, prompt=PROMPT, ignore_eos=True)
    completion = await cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    with pytest.raises(APIError) as caught:
        async for _ in completion.deltas:
            pass
    assert caught.value.status == 504 and "first token" in caught.value.message
    await completion.close()
    await cluster.pipeline.background.wait()

    event, charged, _ = await billed(redis_url, tenant.name, request.request_id)
    # Whole chunks of a prompt no cache had (a new tenant), not all of them, and
    # no completion: none was delivered.
    assert 0 < event.prompt_tokens < len(PROMPT)
    assert event.prompt_tokens % CHUNK == 0
    assert (event.cached_prompt_tokens, event.completion_tokens) == (0, 0)
    assert (event.finish_reason, event.tenant) == ("first_token_timeout", tenant.name)
    # The TPM window holds what was billed, not the reservation, not zero.
    assert int(charged) == event.prompt_tokens
    # And the engine stopped: nothing of the request is left running.
    async with open_channel(engine_address, "test") as channel:
        load = await engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest())
    assert (load.running, load.waiting) == (0, 0)
