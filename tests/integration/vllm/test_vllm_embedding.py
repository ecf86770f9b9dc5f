"""`maas serve engine --backend vllm --serves embed` in front of vLLM's pooling runner.

A server of its own (vLLM runs one runner), started with the flags the
operator gives one (services/common/serves.py VLLM_POOLING_ARGS): its vectors are
the native engine's, under the same contract.
"""

import asyncio

import grpc
import pytest
import torch

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from maas_services.common.serves import VLLM_POOLING_ARGS
from maas_services.engine.core.build import build_engine
from maas_services.engine.sampling_params import EmbeddingParams, SamplingParams
from maas_services.engine.settings import EngineSettings
from maas_tools.local.readiness import wait_ready
from maas_tools.peers.model_folder import hf_model_folder
from maas_tools.peers.vllm_server import VllmConfig, VllmServer
from tests.integration.vllm.conftest import (
    API_KEY,
    BLOCK_SIZE,
    MODEL_ID,
    PROMPT,
    SERVED_MODEL,
    adapter_process,
    generate_request,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pooling_server(vllm_python, tmp_path_factory):
    config = VllmConfig(
        python=vllm_python,
        model=hf_model_folder(None),
        served_model_name=SERVED_MODEL,
        kv_cache_gib=1,
        enforce_eager=True,
        dtype="float32",
        max_model_len=2048,
        extra_args=["--block-size", str(BLOCK_SIZE), *VLLM_POOLING_ARGS],
        api_key=API_KEY,
    )
    server = VllmServer(config, tmp_path_factory.mktemp("pooling") / "vllm.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def embed_adapter(pooling_server, tmp_path_factory) -> str:
    process, address = adapter_process(
        pooling_server,
        tmp_path_factory.mktemp("embed-adapter"),
        **{"serves": "embed", "vllm-kv-events-endpoint": ""},
    )
    process.start()
    asyncio.run(wait_ready(process, address, timeout=120))
    yield address
    process.stop(timeout=30)


@pytest.fixture
async def embed_stub(embed_adapter):
    async with grpc.aio.insecure_channel(embed_adapter) as channel:
        yield engine_pb2_grpc.EngineStub(channel)


@pytest.fixture(scope="module")
def native_vector():
    """The native engine's vector of PROMPT (float32), the reference."""
    engine = build_engine(
        EngineSettings(
            dtype="float32",
            wide_gemm="float32",
            kv_cache_dtype="model",
            device="cpu",
            kv_cache_memory=16 * 1024**2,
        )
    )
    engine.add_request("ref", PROMPT, SamplingParams(max_tokens=0, embedding=EmbeddingParams()))
    outputs = []
    while engine.has_work:
        outputs += engine.step()
    return torch.tensor(outputs[-1].embedding)


def embedding_request(request_id: str, dimensions: int = 0, prompt=PROMPT):
    embedding = engine_pb2.Embedding(dimensions=dimensions)
    return generate_request(request_id, prompt=prompt, embedding=embedding)


async def test_the_vector_is_the_native_engines_under_the_same_contract(embed_stub, native_vector):
    (response,) = [r async for r in embed_stub.Generate(embedding_request("e"))]
    assert response.finish_reason == common_pb2.FINISH_REASON_STOP
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(PROMPT), 0)
    assert response.computed_prompt_tokens == len(PROMPT)
    torch.testing.assert_close(
        torch.tensor(list(response.embedding)), native_vector, atol=1e-3, rtol=0
    )


async def test_dimensions_are_the_leading_ones_renormalized(embed_stub, native_vector):
    (response,) = [r async for r in embed_stub.Generate(embedding_request("d", dimensions=16))]
    lead = native_vector[:16]
    torch.testing.assert_close(
        torch.tensor(list(response.embedding)), lead / lead.norm(), atol=1e-3, rtol=0
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        [r async for r in embed_stub.Generate(embedding_request("big", dimensions=577))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "embedding.dimensions must be in [1, 576]" in refused.value.details()


async def test_an_embedding_adapter_reports_embed_and_refuses_generation(embed_stub):
    load = await embed_stub.GetLoad(engine_pb2.GetLoadRequest())
    assert list(load.serves) == ["embed"] and load.model == MODEL_ID
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        [r async for r in embed_stub.Generate(generate_request("g", max_tokens=4))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not serve generation" in refused.value.details()


async def test_a_prompt_over_vllms_context_is_invalid(embed_stub):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        [r async for r in embed_stub.Generate(embedding_request("long", prompt=PROMPT * 60))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context length" in refused.value.details()
