"""The Lua rate limiter against a real Redis, shared by two "replicas"."""

import asyncio
import uuid

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.rate_limiter import RateLimiter, format_duration
from maas_services.gateway.admission.tenants import Tenant
from maas_tools.local.ports import free_port


def tenant(**limits) -> Tenant:
    return Tenant(name=f"rl-{uuid.uuid4().hex[:10]}", **limits)


@pytest.fixture
async def replicas(redis_url):
    """Two limiters with their own connections, as two gateway processes have."""
    clients = [open_redis(redis_url), open_redis(redis_url)]
    yield [RateLimiter(c, lease_seconds=60) for c in clients]
    for client in clients:
        await client.aclose()


async def take(limiter, who, request_id, need):
    """Both steps of admission, as the pipeline does them around tokenizing."""
    decision = await limiter.admit(who, request_id, need)
    return await limiter.reserve(decision, request_id, need)


async def admitted(limiter, who, need=1) -> bool:
    try:
        await take(limiter, who, f"req-{uuid.uuid4().hex}", need)
    except APIError as error:
        assert error.status == 429
        return False
    return True


async def test_rpm_is_exact_across_replicas(replicas):
    who = tenant(rpm=10)
    tries = [admitted(replicas[i % 2], who) for i in range(40)]
    assert sum(await asyncio.gather(*tries)) == 10


async def test_concurrency_is_exact_across_replicas_and_freed_on_settle(replicas):
    who = tenant(max_concurrency=3)
    ids = [f"req-{i}-{uuid.uuid4().hex}" for i in range(20)]

    async def one(index):
        try:
            await replicas[index % 2].admit(who, ids[index], 1)
        except APIError:
            return None
        return ids[index]

    running = [r for r in await asyncio.gather(*(one(i) for i in range(20))) if r]
    assert len(running) == 3
    await replicas[0].settle(who, running[0], 1)
    assert await admitted(replicas[1], who)
    assert not await admitted(replicas[0], who)


async def test_tpm_reserves_then_settles_to_real_usage(replicas):
    first, second = replicas
    who = tenant(tpm=100)
    await take(first, who, "a", 60)
    with pytest.raises(APIError) as caught:
        await take(second, who, "b", 60)
    assert caught.value.type == "tokens"
    # "a" used 30 of its 60: the refund makes room for exactly 70 more.
    await first.settle(who, "a", 30)
    assert not await admitted(second, who, 71)
    decision = await take(second, who, "c", 70)
    assert decision.tokens_left == 0
    # A request that ran past its reservation is charged the excess.
    await second.settle(who, "c", 75)
    await first.settle(who, "a", 20)
    assert not await admitted(first, who, 6)
    assert await admitted(first, who, 5)


async def test_refusal_is_an_openai_429_with_headers(replicas):
    who = tenant(rpm=2, tpm=1000)
    ok = await take(replicas[0], who, "a", 100)
    headers = ok.headers()
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "900"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    await take(replicas[1], who, "b", 100)
    with pytest.raises(APIError) as caught:
        await take(replicas[0], who, "c", 100)
    error = caught.value
    assert error.code == "rate_limit_exceeded" and error.type == "requests"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    # The oldest request leaves the window in just under a minute.
    assert 55 <= int(error.headers["Retry-After"]) <= 60


async def test_a_request_larger_than_the_tpm_is_refused_as_too_large(replicas):
    with pytest.raises(APIError) as caught:
        await replicas[0].admit(tenant(tpm=50), "a", 51)
    assert "Request too large" in caught.value.message


async def test_a_request_counts_before_its_tokens_are_known(replicas):
    first, second = replicas
    who = tenant(rpm=2, tpm=100, max_concurrency=1)
    counted = await first.admit(who, "a", 1)
    assert counted.requests_left == 1 and counted.tokens_left == 100
    # Tokenized, it turns out too large: refused, but it was a request all the same.
    with pytest.raises(APIError) as caught:
        await second.reserve(counted, "a", 101)
    assert "Request too large" in caught.value.message
    # Until it settles it holds the tenant's one concurrency slot.
    with pytest.raises(APIError) as caught:
        await second.admit(who, "b", 1)
    assert "concurrent" in caught.value.message
    await first.settle(who, "a", 0)
    assert await admitted(second, who)
    assert not await admitted(first, who)


async def test_admitted_with_its_need_it_is_counted_and_charged_in_one_call(replicas):
    first, second = replicas
    who = tenant(rpm=3, tpm=100, max_concurrency=2)
    ok = await first.admit(who, "a", 1, need=60)
    assert (ok.requests_left, ok.tokens_left) == (2, 40)
    with pytest.raises(APIError) as caught:
        await second.admit(who, "b", 1, need=41)
    assert caught.value.type == "tokens" and "requested 41" in caught.value.message
    # Refused for its need, "b" still counts as a request, but holds no slot.
    ok = await second.admit(who, "c", 1, need=40)
    assert (ok.requests_left, ok.tokens_left) == (0, 0)
    with pytest.raises(APIError) as caught:
        await first.admit(tenant(tpm=50), "d", 1, need=51)
    assert "it needs 51 tokens" in caught.value.message


async def test_one_call_names_the_limit_the_two_steps_would(replicas):
    first, second = replicas
    who = tenant(tpm=100, max_concurrency=1)
    await first.admit(who, "a", 1, need=10)
    # The two steps refuse for concurrency before the need is looked at.
    with pytest.raises(APIError) as caught:
        await second.admit(who, "b", 1, need=200)
    assert "concurrent" in caught.value.message
    # And for the floor before concurrency.
    with pytest.raises(APIError) as caught:
        await second.admit(who, "c", 95, need=200)
    assert caught.value.type == "tokens" and "requested 95" in caught.value.message


async def test_n_sequences_take_n_concurrency_slots(replicas):
    first, second = replicas
    who = tenant(max_concurrency=4)
    await first.admit(who, "three", 1, sequences=3)
    with pytest.raises(APIError) as caught:
        await second.admit(who, "two", 1, sequences=2)
    assert "concurrent" in caught.value.message
    await second.admit(who, "one", 1)
    await first.settle(who, "three", 0, sequences=3)
    await second.admit(who, "two", 1, sequences=2)
    with pytest.raises(APIError):
        await first.admit(who, "another", 1, sequences=2)


async def test_the_window_slides(redis_url):
    redis = open_redis(redis_url)
    limiter = RateLimiter(redis, lease_seconds=60, window_seconds=0.5)
    who = tenant(rpm=2, tpm=10)
    try:
        assert await admitted(limiter, who, 5)
        await asyncio.sleep(0.3)
        assert await admitted(limiter, who, 5)
        assert not await admitted(limiter, who, 1)
        # The first request has left the window, the second not yet.
        await asyncio.sleep(0.25)
        assert await admitted(limiter, who, 5)
        assert not await admitted(limiter, who, 1)
    finally:
        await redis.aclose()


async def test_unlimited_tenants_never_touch_redis():
    unreachable = open_redis(f"redis://127.0.0.1:{free_port()}/0")
    limiter = RateLimiter(unreachable, lease_seconds=60, on_redis_error="fail_closed")
    decision = await limiter.admit(tenant(), "a", 10**6)
    assert decision.admitted and decision.headers() == {}


async def test_redis_down_fails_open_or_closed_as_configured():
    unreachable = open_redis(f"redis://127.0.0.1:{free_port()}/0")
    opened = RateLimiter(unreachable, lease_seconds=60, on_redis_error="fail_open")
    decision = await opened.admit(tenant(rpm=1), "a", 1)
    assert decision.admitted and decision.bypassed and decision.headers() == {}
    closed = RateLimiter(unreachable, lease_seconds=60, on_redis_error="fail_closed")
    with pytest.raises(APIError) as caught:
        await closed.admit(tenant(rpm=1), "a", 1)
    assert caught.value.status == 503
    await unreachable.aclose()


@pytest.mark.parametrize(
    ("ms", "text"), [(20, "20ms"), (1500, "1.5s"), (60_000, "1m0s"), (61_250, "1m1.25s")]
)
def test_reset_durations_read_like_openais(ms, text):
    assert format_duration(ms) == text
