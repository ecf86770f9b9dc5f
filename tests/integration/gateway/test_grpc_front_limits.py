"""The tenant gRPC front under a public port's limits, served as `maas serve gateway` does.

A real front (start_grpc_front) over a real tokenizer service, stub engine and
router speaking their protocols, and tenants in real Redis.
"""

import asyncio
import uuid
from dataclasses import dataclass

import grpc
import pytest

from maas.v1 import engine_pb2_grpc, gateway_pb2, gateway_pb2_grpc, router_pb2_grpc
from maas_services.common.openai_api.errors import APIError
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import Principal, TenantStore
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.server import build_pipeline
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.upstreams import Upstreams
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings
from tests.integration.gateway.conftest import parsed
from tests.integration.gateway.stubs import StubEngine, StubRouter, start
from tests.unit.common.conftest import model_path, tokenizer  # noqa: F401  (fixtures)

MODEL = "stub-model"
BODY_LIMIT = 64 * 1024
MAX_RPCS = 2
COMPLETION = "/maas.v1.Gateway/Completion"


class CountingAuthenticator(Authenticator):
    """The real authenticator, counting how often a call got as far as the key check."""

    checks = 0

    async def authenticate(self, authorization):
        self.checks += 1
        return await super().authenticate(authorization)


@dataclass
class Front:
    address: str
    api_key: str
    auth: CountingAuthenticator
    engine: StubEngine
    router: StubRouter
    pipeline: Pipeline
    principal: Principal


@pytest.fixture
async def front(redis_url, tmp_path, tokenizer):  # noqa: F811
    tokenizer_handle, pool = await start_tokenizer(TokenizerSettings(model_id=MODEL), tokenizer)
    engine = StubEngine(MODEL, ["Hello", " there"])
    engine_server, engine_address = await start(
        engine, engine_pb2_grpc.add_EngineServicer_to_server
    )
    router = StubRouter([("e0", engine_address, MODEL)])
    router_server, router_address = await start(
        router, router_pb2_grpc.add_RouterServicer_to_server
    )
    settings = GatewaySettings(
        redis_url=redis_url,
        max_body_bytes=BODY_LIMIT,
        grpc_max_concurrent_rpcs=MAX_RPCS,
        models_cache_seconds=0,
        usage_spool_dir=str(tmp_path / "spool"),
    )
    redis = open_redis(redis_url)
    upstreams = Upstreams(f"127.0.0.1:{tokenizer_handle.port}", router_address)
    (tmp_path / "routes.yaml").write_text("")
    pipeline = build_pipeline(
        settings, upstreams, redis, RoutesWatcher(str(tmp_path / "routes.yaml"))
    )
    store = TenantStore(redis)
    tenant = await store.create_tenant(f"grpc-{uuid.uuid4().hex[:8]}")
    key_id, api_key = await store.create_key(tenant.name)
    auth = CountingAuthenticator(store)
    handle = await start_grpc_front(settings, pipeline, auth)
    principal = Principal(tenant, key_id)
    yield Front(f"127.0.0.1:{handle.port}", api_key, auth, engine, router, pipeline, principal)
    await handle.server.stop(0)
    await pipeline.background.wait()
    for server in (router_server, engine_server, tokenizer_handle.server):
        await server.stop(0)
    pool.shutdown()
    await upstreams.close()
    await redis.aclose()


def key(api_key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {api_key}")]


def completion(prompt: str = "Hi") -> gateway_pb2.CompletionRequest:
    return gateway_pb2.CompletionRequest(
        model=MODEL, prompt=prompt, options=gateway_pb2.CompletionOptions(max_tokens=2)
    )


async def raw_call(address: str, payload: bytes, metadata) -> grpc.aio.AioRpcError:
    """Send bytes as the Completion message, unserialized: what an attacker can send."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_stream(COMPLETION)(payload, metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
    return caught.value


async def test_a_completion_streams_through_the_front(front):
    async with grpc.aio.insecure_channel(front.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        chunks = [c async for c in stub.Completion(completion(), metadata=key(front.api_key))]
        models = await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=key(front.api_key))
    assert "".join(c.text for c in chunks) == "Hello there"
    assert [m.id for m in models.models] == [MODEL]


async def test_the_session_header_wins_over_user_as_over_http(front):
    request = completion()
    request.options.user = "the-user"
    async with grpc.aio.insecure_channel(front.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for metadata in (key(front.api_key), [*key(front.api_key), ("x-session-id", "s-1")]):
            assert [c async for c in stub.Completion(request, metadata=metadata)]
    assert front.router.sessions == ["the-user", "s-1"]


async def test_a_message_over_the_body_limit_is_refused_and_never_parsed(front):
    oversize = completion("x" * BODY_LIMIT).SerializeToString()
    # Without a key, the call ends on its headers, before grpc reads the message.
    anonymous = await raw_call(front.address, oversize, [])
    assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED
    keyed = await raw_call(front.address, oversize, key(front.api_key))
    assert keyed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert front.engine.served == 0


async def test_the_key_is_checked_before_the_message_is_parsed(front):
    garbage = b"\xff" * 100
    anonymous = await raw_call(front.address, garbage, [])
    assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED
    keyed = await raw_call(front.address, garbage, key(front.api_key))
    assert keyed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid maas.v1.CompletionRequest" in keyed.details()


async def test_calls_beyond_the_concurrency_cap_are_refused(front):
    front.engine.hang = True
    async with grpc.aio.insecure_channel(front.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        held = [stub.Completion(completion(), metadata=key(front.api_key)) for _ in range(MAX_RPCS)]
        while len(front.engine.active) < MAX_RPCS:
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=key(front.api_key))
        for call in held:
            call.cancel()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Concurrent RPC limit" in caught.value.details()


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([7] * 9000, "This model's maximum context length is 8192 tokens"),
        ([1, 2, 10**7], "token ids out of range"),
    ],
)
async def test_token_id_prompts_the_tokenizer_refuses_never_reach_the_router(front, ids, message):
    with pytest.raises(APIError) as caught:
        completion = await front.pipeline.admit(front.principal, parsed(prompt=ids))
        async for _ in completion.deltas:
            pass
    assert caught.value.status == 400 and message in caught.value.message
    assert front.router.picks == []
