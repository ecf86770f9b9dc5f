"""A tenant with no TPM that the limiter last admitted is counted while its
request is tokenized (pipeline.py, _encode_counted): the count's round trip in
the tokenizer's time, counted and refused exactly as when counted first."""

import asyncio
import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Tenant


def tenant(**limits) -> Tenant:
    return Tenant(name=f"overlap-{uuid.uuid4().hex[:8]}", **limits)


def tokenizer_calls(cluster) -> list[int]:
    calls = []

    async def count() -> None:
        calls.append(1)

    cluster.tokenizer.on_call = count
    return calls


async def test_rpm_counts_exactly_and_a_refusal_costs_one_tokenizer_call(make_cluster):
    cluster = await make_cluster(replicas=1)
    who = tenant(rpm=3)
    calls = tokenizer_calls(cluster)
    for _ in range(3):  # counted first, then while tokenized
        assert await cluster.run(who, max_tokens=2)
        await cluster.pipeline.background.wait()
    for _ in range(2):
        with pytest.raises(APIError) as refused:
            await cluster.run(who, max_tokens=2)
        assert refused.value.status == 429 and refused.value.type == "requests"
    # The first refusal was tokenized beside its count; refused last, the next was not.
    assert len(calls) == 4


async def test_a_burst_from_a_tenant_with_room_reaches_the_tokenizer_once(make_cluster):
    """A hostile burst: 16 requests at once from a tenant with no TPM that holds
    its one slot. Only one of them may reach the tokenizer before it is counted."""
    cluster = await make_cluster(replicas=1)
    # The burst's limiter calls each take a Redis connection at once: opened here first,
    # so that a connect slowed past its timeout by a loaded machine (the limiter then
    # fails open, by design) cannot let one of the burst through.
    warm = tenant(max_concurrency=100)
    assert all(await asyncio.gather(*(cluster.run(warm, max_tokens=1) for _ in range(16))))
    await cluster.pipeline.background.wait()
    who = tenant(max_concurrency=1)
    assert await cluster.run(who, max_tokens=8)
    await cluster.pipeline.background.wait()
    held = await cluster.open(who, max_tokens=8)
    calls = tokenizer_calls(cluster)
    results = await asyncio.gather(
        *(cluster.complete(who, max_tokens=8) for _ in range(16)), return_exceptions=True
    )
    assert all(isinstance(r, APIError) and r.status == 429 for r in results)
    assert len(calls) <= 1
    assert [d async for d in held]
    await cluster.pipeline.background.wait()
    # Every refused request's count ended: the slot is free for the next.
    assert await cluster.run(who, max_tokens=8)
