"""RenderChat over real gRPC: tools in a template's own format or the fallback's, and the
format the gateway should read the answer in."""

import dataclasses
import json
from pathlib import Path

import grpc
import pytest

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings

QWEN_TEMPLATE = (
    Path(__file__).parents[2] / "unit" / "common" / "qwen2_5_chat_template.jinja"
).read_text()
TOOLS = json.dumps(
    [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
)
HISTORY = [
    tokenizer_pb2.ChatMessage(role="user", content="Weather in Oslo?"),
    tokenizer_pb2.ChatMessage(
        role="assistant",
        tool_calls=[
            tokenizer_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
        ],
    ),
    tokenizer_pb2.ChatMessage(role="tool", tool_call_id="call_1", content="4 degrees"),
]


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5"])
async def stub(request, tokenizer):
    template = QWEN_TEMPLATE if request.param == "qwen2.5" else tokenizer.chat_template
    served = dataclasses.replace(tokenizer, chat_template=template)
    settings = TokenizerSettings(model_id=DEFAULT_MODEL_ID, encode_threads=1)
    handle, pool = await start_tokenizer(settings, served)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
        yield request.param, tokenizer_pb2_grpc.TokenizerStub(channel)
    await handle.server.stop(0)
    pool.shutdown()


async def test_tools_and_calls_render_in_the_template_format(stub):
    name, stub = stub
    reply = await stub.RenderChat(
        tokenizer_pb2.RenderChatRequest(messages=HISTORY, tools=TOOLS, add_generation_prompt=True)
    )
    assert reply.tool_format == "hermes"
    if name == "qwen2.5":
        assert "# Tools" in reply.prompt and "You may call these functions" not in reply.prompt
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        assert call in reply.prompt
        assert "<tool_response>\n4 degrees\n</tool_response>" in reply.prompt
    else:
        assert "You may call these functions" in reply.prompt
        call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        assert call in reply.prompt
        assert "<|im_start|>tool\n4 degrees<|im_end|>" in reply.prompt
    assert len(reply.token_ids) > 0


async def test_tools_that_are_not_a_list_of_functions_are_refused(stub):
    _, stub = stub
    for tools, problem in [("{", "tools is not JSON"), ('{"a": 1}', "tools must be a list")]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.RenderChat(tokenizer_pb2.RenderChatRequest(messages=HISTORY, tools=tools))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert problem in caught.value.details()
