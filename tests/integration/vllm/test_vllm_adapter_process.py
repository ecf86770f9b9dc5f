"""Adapter processes of their own: a tokenizer that is not vLLM's, and a drain."""

import grpc
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_tools.local.readiness import wait_ready
from tests.integration.vllm.conftest import adapter_process, generate_request

pytestmark = pytest.mark.slow


async def test_a_tokenizer_unlike_vllms_is_refused(vllm_server, tmp_path):
    folder = tmp_path / "other-tokenizer"
    folder.mkdir()
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "fox": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(folder / "tokenizer.json"))
    process, _ = adapter_process(vllm_server, tmp_path, **{"model-path": folder})
    process.start()
    try:
        assert await process.wait_exit() == 1
    finally:
        process.stop(timeout=10)
    assert "vllm_tokenizer_mismatch" in process.log_tail(40)


async def test_drain_refuses_new_requests(vllm_server, tmp_path):
    process, address = adapter_process(vllm_server, tmp_path)
    process.start()
    try:
        await wait_ready(process, address, timeout=120)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            assert (await stub.Drain(engine_pb2.DrainRequest())).in_flight == 0
            assert (await stub.GetLoad(engine_pb2.GetLoadRequest())).draining
            with pytest.raises(grpc.aio.AioRpcError) as error:
                [r async for r in stub.Generate(generate_request("late", max_tokens=1))]
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        process.stop(timeout=30)
