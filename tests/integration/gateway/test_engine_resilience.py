"""Retries, circuit breakers, timeouts and aborts between the gateway and engines."""

import asyncio
import time

import grpc
import pytest

from maas.v1 import engine_pb2_grpc
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.tenants import Tenant
from maas_tools.local.ports import free_port
from tests.integration.gateway.conftest import CHUNKS, MODEL
from tests.integration.gateway.stubs import StubEngine, start


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas)


async def test_a_failed_replica_is_retried_on_another_before_any_token(make_cluster):
    cluster = await make_cluster()
    cluster.engines[0].fail = grpc.StatusCode.UNAVAILABLE
    for _ in range(3):
        assert text_of(await cluster.run()) == "".join(CHUNKS)
    assert cluster.engines[1].served == 3


async def test_client_errors_are_not_retried(make_cluster):
    cluster = await make_cluster()
    for engine in cluster.engines:
        engine.fail = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 400
    assert len(cluster.router.picks) == 1


async def test_breaker_opens_on_a_dead_endpoint_and_recovers(make_cluster):
    cluster = await make_cluster(
        replicas=1, breaker_failures=2, breaker_cooldown_seconds=0.5, connect_timeout_seconds=0.3
    )
    # The breakers read a clock the test moves: on a loaded machine the requests
    # below can outlast the cooldown, and a real clock would let a probe through.
    now = [1000.0]
    cluster.pipeline.engine._breakers._clock = lambda: now[0]
    dead_port = free_port()
    cluster.router.endpoints.append(("dead", f"127.0.0.1:{dead_port}", MODEL))
    # Every request is served; the dead endpoint costs a connect timeout each
    # time until its breaker opens, then it is no longer picked at all.
    for _ in range(6):
        assert text_of(await cluster.run()) == "".join(CHUNKS)
    assert cluster.router.picks.count("dead") == 2
    picks_before = len(cluster.router.picks)
    for _ in range(4):
        await cluster.run()
    assert "dead" not in cluster.router.picks[picks_before:]

    # The endpoint comes back: after the cooldown a probe goes to it, and once
    # that succeeds it takes its share again.
    revived = StubEngine(MODEL, CHUNKS)
    server, _ = await start(revived, engine_pb2_grpc.add_EngineServicer_to_server, dead_port)
    now[0] += 0.5
    try:
        deadline = time.monotonic() + 15
        while revived.served < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await cluster.run()
        assert revived.served >= 2
    finally:
        await server.stop(0)


async def test_first_token_timeout_tries_each_replica_then_answers_504(make_cluster):
    cluster = await make_cluster(first_token_timeout_seconds=0.3)
    for engine in cluster.engines:
        engine.hang = True
    started = time.monotonic()
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 504
    assert sorted(cluster.router.picks) == ["e0", "e1"]
    # Two 0.3 s timeouts, not the default's minute: a hang guard, not a speed test.
    assert time.monotonic() - started < 20


async def test_closing_the_stream_cancels_the_engine_request_within_100ms(make_cluster):
    cluster = await make_cluster(replicas=1, chunks=[f" t{i}" for i in range(200)], delay=0.02)
    deltas = await cluster.open()
    await anext(deltas)
    closed_at = time.monotonic()
    await deltas.aclose()
    engine = cluster.engines[0]
    for _ in range(50):
        if engine.cancelled_at:
            break
        await asyncio.sleep(0.01)
    (cancelled_at,) = engine.cancelled_at.values()
    assert cancelled_at - closed_at < 0.1
    assert not engine.active


async def test_tier_sets_the_engine_priority(make_cluster):
    cluster = await make_cluster(replicas=1)
    await cluster.run(Tenant(name="gold", tier="premium"))
    await cluster.run(Tenant(name="basic", tier="free"))
    assert cluster.engines[0].priorities == [2, 0]


async def test_a_full_queue_answers_503_with_retry_after(make_cluster):
    routes = f"deployments:\n  {MODEL}: {{max_in_flight: 1}}\n"
    cluster = await make_cluster(replicas=1, routes=routes, queue_size=1)
    cluster.engines[0].hang = True
    holding = asyncio.create_task(cluster.run())
    waiting = asyncio.create_task(cluster.run())
    await asyncio.sleep(0.2)
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 503
    assert caught.value.headers["Retry-After"]
    holding.cancel()
    waiting.cancel()
    await asyncio.gather(holding, waiting, return_exceptions=True)


async def test_queue_timeout_answers_503(make_cluster):
    routes = f"deployments:\n  {MODEL}: {{max_in_flight: 1}}\n"
    cluster = await make_cluster(replicas=1, routes=routes, queue_timeout_seconds=0.2)
    cluster.engines[0].hang = True
    holding = asyncio.create_task(cluster.run())
    await asyncio.sleep(0.1)
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 503 and "within 0.2s" in caught.value.message
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
