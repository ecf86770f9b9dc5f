"""The tenant gRPC API at the gateway, with a real grpc.aio client."""

import grpc
import pytest

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


def auth(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def test_chat_stream_over_grpc(stack):
    async with grpc.aio.insecure_channel(stack.gateway_grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.ChatCompletionRequest(
            model=DEFAULT_MODEL_ID,
            messages=[
                tokenizer_pb2.ChatMessage(role="user", content="What is the capital of France?")
            ],
            options=gateway_pb2.CompletionOptions(temperature=0, max_tokens=24),
        )
        chunks = [c async for c in stub.ChatCompletion(request, metadata=auth(stack.api_key))]
    assert "Paris" in "".join(c.text for c in chunks)
    last = chunks[-1]
    assert last.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    assert last.usage.prompt_tokens > 0
    assert 0 < last.usage.completion_tokens <= 24


async def test_list_models_over_grpc(stack):
    async with grpc.aio.insecure_channel(stack.gateway_grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        reply = await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=auth(stack.api_key))
    assert [m.id for m in reply.models] == [DEFAULT_MODEL_ID]


@pytest.mark.parametrize(
    ("metadata", "options", "model", "code"),
    [
        ([], {}, DEFAULT_MODEL_ID, grpc.StatusCode.UNAUTHENTICATED),
        (None, {"temperature": -1}, DEFAULT_MODEL_ID, grpc.StatusCode.INVALID_ARGUMENT),
        (None, {"top_p": 2}, DEFAULT_MODEL_ID, grpc.StatusCode.INVALID_ARGUMENT),
        (None, {}, "no-such-model", grpc.StatusCode.NOT_FOUND),
    ],
)
async def test_grpc_errors_use_status_codes(stack, metadata, options, model, code):
    async with grpc.aio.insecure_channel(stack.gateway_grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.CompletionRequest(
            model=model, prompt="Hi", options=gateway_pb2.CompletionOptions(max_tokens=2, **options)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.Completion(
                request, metadata=auth(stack.api_key) if metadata is None else metadata
            ):
                pass
    assert caught.value.code() == code
