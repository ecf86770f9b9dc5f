"""`maas serve engine` answers embeddings over gRPC, and serves what --serves says."""

import asyncio

import grpc
import pytest

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow

PROMPT = [1, 9690, 198, 19556, 451, 253, 1345, 30]


@pytest.fixture(scope="module")
def embed_only(tmp_path_factory):
    """An engine started with --serves embed: its address."""
    port = free_port()
    flags = {"port": port, "metrics-port": free_port(), "dtype": "float32", "serves": "embed"}
    process = ManagedProcess(
        "engine", serve_argv("engine", flags), tmp_path_factory.mktemp("embed") / "engine.log"
    )
    process.start()
    address = f"127.0.0.1:{port}"
    asyncio.run(wait_ready(process, address, timeout=300))
    yield address
    process.stop(timeout=30)


def embedding_request(request_id: str, dimensions: int = 0) -> engine_pb2.GenerateRequest:
    return engine_pb2.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=PROMPT,
        sampling=engine_pb2.SamplingParams(embedding=engine_pb2.Embedding(dimensions=dimensions)),
    )


async def generate(address: str, request) -> list[engine_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(address) as channel:
        return [r async for r in engine_pb2_grpc.EngineStub(channel).Generate(request)]


async def serves(address: str) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        load = await engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest())
    return list(load.serves)


async def test_an_embedding_is_one_message_with_the_vector_and_usage(embed_only):
    (response,) = await generate(embed_only, embedding_request("e", dimensions=32))
    assert response.finish_reason == common_pb2.FINISH_REASON_STOP
    assert len(response.embedding) == 32 and not response.token_ids
    assert sum(x * x for x in response.embedding) == pytest.approx(1.0, abs=1e-5)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(PROMPT), 0)
    assert response.computed_prompt_tokens == len(PROMPT)


async def test_an_embed_only_engine_refuses_generation_and_says_so(embed_only):
    assert await serves(embed_only) == ["embed"]
    generation = engine_pb2.GenerateRequest(
        request_id="g", prompt_token_ids=PROMPT, sampling=engine_pb2.SamplingParams(max_tokens=4)
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await generate(embed_only, generation)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not serve generation" in refused.value.details()


@pytest.mark.parametrize("dimensions", [-1, 577])
async def test_dimensions_outside_the_hidden_size_are_invalid(embed_only, dimensions):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await generate(embed_only, embedding_request("bad", dimensions))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "embedding.dimensions must be in [1, 576]" in refused.value.details()


async def test_a_native_engine_serves_both_by_default(engine):
    _, address = engine
    assert await serves(address) == ["generate", "embed"]
    (response,) = await generate(address, embedding_request("both"))
    assert len(response.embedding) == 576


async def test_a_router_reports_what_its_ready_replicas_serve(embed_only, tmp_path):
    port = free_port()
    flags = {"port": port, "metrics-port": free_port(), "engines": f"e0={embed_only}"}
    router = ManagedProcess("router", serve_argv("router", flags), tmp_path / "router.log")
    router.start()
    try:
        await wait_ready(router, f"127.0.0.1:{port}", timeout=60)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            pool = router_pb2_grpc.RouterStub(channel)
            # Bounded only so that a router that never polls the engine fails.
            for _ in range(300):
                stats = await pool.GetPoolStats(router_pb2.PoolStatsRequest())
                if stats.deployments and stats.deployments[0].ready_replicas:
                    break
                await asyncio.sleep(0.1)
    finally:
        router.stop(timeout=10)
    (deployment,) = stats.deployments
    assert deployment.ready_replicas == 1
    assert list(deployment.serves) == ["embed"]
