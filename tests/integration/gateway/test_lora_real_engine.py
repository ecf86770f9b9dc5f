"""A tenant's adapter end to end on a real engine: the gateway loads it on demand (the
engine answered NOT_FOUND), the answer is the adapter's (upper case, unlike the
base's), the usage event names it, and another tenant gets a 404 and loads nothing.

One real engine process (the real model, float32, greedy) behind the stub router
and tokenizer of the gateway's fixtures (prompts go as token ids); the adapter is
tests/lora_fixture.py's, trained once and cached.
"""

import asyncio
import uuid
from dataclasses import replace

import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, parsed, read_as_a_front
from tests.integration.gateway.test_migration_real import chat, killable, tokenizer  # noqa: F401
from tests.integration.gateway.usage_stream import usage_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    replica = killable("lora", tmp_path_factory.mktemp("lora-engine"))
    asyncio.run(replica.start(timeout=300))
    yield replica
    replica.process.stop(timeout=30)


def routes(owner: str, source) -> str:
    return f"""
deployments:
  {MODEL}: {{}}
adapters:
  upper-{owner}: {{deployment: {MODEL}, source: "{source}", tenants: [{owner}]}}
"""


async def answer(cluster, who: Tenant, model: str, prompt: list[int]) -> str:
    request = replace(parsed(prompt=prompt, max_tokens=12), model=model)
    run = await cluster.pipeline.admit(Principal(who, "key_test"), request)
    return "".join([d.text async for d in read_as_a_front(run)])


async def loaded(engine) -> list[str]:
    async with open_channel(engine.address, "test") as channel:
        report = await engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest())
    return list(report.adapters)


async def test_an_adapter_loaded_on_demand_answers_as_the_adapter(
    make_cluster,
    engine,
    tokenizer,  # noqa: F811
    lora_adapter_dir,
    redis_url,
):
    owner = Tenant(name=f"real-{uuid.uuid4().hex[:8]}")
    other = Tenant(name=f"real-{uuid.uuid4().hex[:8]}")
    cluster = await make_cluster(replicas=0, routes=routes(owner.name, lora_adapter_dir))
    cluster.router.endpoints.append((engine.name, engine.address, MODEL))
    adapter = f"upper-{owner.name}"
    prompt = chat(tokenizer, QUESTION)

    with pytest.raises(APIError) as caught:
        await answer(cluster, other, adapter, prompt)
    assert caught.value.status == 404
    assert adapter not in await loaded(engine)

    base = await answer(cluster, owner, MODEL, prompt)
    upper = await answer(cluster, owner, adapter, prompt)
    assert adapter in await loaded(engine)
    letters = [c for c in upper if c.isalpha()]
    assert letters and all(c.isupper() for c in letters), upper
    assert upper != base
    await cluster.pipeline.background.wait()
    events = await usage_events(redis_url, owner.name)
    assert [(e.deployment, e.adapter) for e in events] == [(MODEL, ""), (MODEL, adapter)]
