"""Admission meters a request before any work is done for it, and n sequences cost n."""

import asyncio
import uuid

import grpc
import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Tenant
from tests.integration.gateway.conftest import MODEL


def tenant(**limits) -> Tenant:
    return Tenant(name=f"meter-{uuid.uuid4().hex[:8]}", **limits)


async def admit_over_long(cluster, who: Tenant) -> APIError:
    with pytest.raises(APIError) as caught:
        await cluster.complete(who)
    # The refused request's lease is ended in the background.
    await cluster.pipeline.background.wait()
    return caught.value


async def test_over_long_prompts_count_toward_rpm_and_free_their_slot(make_cluster):
    cluster = await make_cluster(replicas=1)
    # What the tokenizer answers for a prompt past the context length.
    cluster.tokenizer.refuse = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "This model's maximum context length is 2048 tokens, your prompt has 9000.",
    )
    # One slot: each failed request must have given it back for the next to be tried.
    who = tenant(rpm=3, max_concurrency=1)
    for _ in range(3):
        assert (await admit_over_long(cluster, who)).status == 400
    refused = await admit_over_long(cluster, who)
    assert refused.status == 429 and refused.code == "rate_limit_exceeded"
    assert refused.type == "requests"


async def test_a_tenant_with_room_is_counted_once_tokenized_and_one_refused_before(
    make_cluster, redis_url
):
    cluster = await make_cluster(replicas=1)
    who = tenant(tpm=1000, max_concurrency=1)
    redis = open_redis(redis_url)
    counted_at_tokenizing = []

    async def look() -> None:
        counted_at_tokenizing.append(await redis.zcard(f"maas:rl:{{{who.name}}}:log"))

    cluster.tokenizer.on_call = look
    try:
        # Not seen yet: counted first. Then admitted last: counted (and
        # charged) in one call after tokenizing, so its tokenizer saw one.
        assert await cluster.run(who, max_tokens=8)
        await cluster.pipeline.background.wait()
        held = await cluster.open(who, max_tokens=8)
        assert counted_at_tokenizing == [1, 1]
        # Tokenized, then refused for the held slot; refused last, the next
        # is refused before the tokenizer is asked.
        for _ in range(2):
            with pytest.raises(APIError) as caught:
                await cluster.complete(who, max_tokens=8)
            assert caught.value.status == 429 and "concurrent" in caught.value.message
        assert counted_at_tokenizing == [1, 1, 2]
        assert [d async for d in held]
    finally:
        await redis.aclose()


async def test_n_sequences_count_as_n_against_concurrency(make_cluster):
    cluster = await make_cluster(replicas=1)
    who = tenant(max_concurrency=4)
    four = await cluster.open(who, n=4)
    with pytest.raises(APIError) as caught:
        await cluster.open(who)
    assert caught.value.status == 429 and "concurrent" in caught.value.message
    assert [d async for d in four]
    await cluster.pipeline.background.wait()
    assert await cluster.run(who, n=4)


async def test_more_sequences_than_the_concurrency_limit_is_a_400(make_cluster):
    cluster = await make_cluster(replicas=1)
    with pytest.raises(APIError) as caught:
        await cluster.open(tenant(max_concurrency=2), n=3)
    assert caught.value.status == 400 and caught.value.param == "n"


async def test_n_sequences_take_n_slots_of_the_deployment(make_cluster):
    routes = f"deployments:\n  {MODEL}: {{max_in_flight: 4}}\n"
    # No waiting room: a request that does not fit now is refused at once.
    cluster = await make_cluster(replicas=1, routes=routes, queue_size=0)
    four = await cluster.open(n=4)
    with pytest.raises(APIError) as caught:
        await cluster.open()
    assert caught.value.status == 503 and "full" in caught.value.message
    assert [d async for d in four]
    assert await cluster.run()


async def test_a_burst_from_a_tenant_with_room_is_counted_before_it_is_tokenized(make_cluster):
    """A hostile burst: 16 requests at once from a tenant that holds its one slot.
    Only one of them may reach the tokenizer before the limiter sees it."""
    cluster = await make_cluster(replicas=1)
    who = tenant(tpm=100_000, max_concurrency=1)
    assert await cluster.run(who, max_tokens=8)  # admitted last: the one-call path
    await cluster.pipeline.background.wait()
    held = await cluster.open(who, max_tokens=8)
    calls = []

    async def count() -> None:
        calls.append(1)

    cluster.tokenizer.on_call = count
    results = await asyncio.gather(
        *(cluster.complete(who, max_tokens=8) for _ in range(16)), return_exceptions=True
    )
    assert all(isinstance(r, APIError) and r.status == 429 for r in results)
    assert len(calls) <= 1
    assert [d async for d in held]
