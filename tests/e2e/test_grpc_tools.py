"""Tools, tool calls and response_format on the tenant gRPC front, through the whole stack."""

import json

import grpc
import jsonschema
import pytest

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.e2e.test_structured_outputs import HISTORY, WEATHER, City

pytestmark = pytest.mark.slow


def proto_message(message: dict) -> tokenizer_pb2.ChatMessage:
    calls = [
        tokenizer_pb2.ToolCall(
            id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]
        )
        for c in message.get("tool_calls", [])
    ]
    return tokenizer_pb2.ChatMessage(
        role=message["role"],
        content=message["content"] or "",
        tool_call_id=message.get("tool_call_id", ""),
        tool_calls=calls,
    )


def proto_tool(tool: dict, parameters: str | None = None) -> gateway_pb2.Tool:
    function = tool["function"]
    return gateway_pb2.Tool(
        type="function",
        function=gateway_pb2.FunctionDefinition(
            name=function["name"],
            description=function["description"],
            parameters=json.dumps(function["parameters"]) if parameters is None else parameters,
        ),
    )


@pytest.fixture
async def chat(stack):
    async with grpc.aio.insecure_channel(stack.gateway_grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def call(
            messages=HISTORY, options=None, **fields
        ) -> list[gateway_pb2.CompletionChunk]:
            request = gateway_pb2.ChatCompletionRequest(
                model=DEFAULT_MODEL_ID,
                messages=[proto_message(m) for m in messages],
                options=options or gateway_pb2.CompletionOptions(temperature=0, max_tokens=48),
                **fields,
            )
            metadata = [("authorization", f"Bearer {stack.api_key}")]
            return [c async for c in stub.ChatCompletion(request, metadata=metadata)]

        yield call


async def test_a_required_call_after_a_history_of_calls_validates(chat):
    # The history holds an assistant tool_calls message and its tool answer.
    chunks = await chat(
        tools=[proto_tool(WEATHER)], tool_choice=gateway_pb2.ToolChoice(mode="required")
    )
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    assert [(c.index, c.type, c.name) for c in calls] == [(0, "function", "get_weather")]
    assert calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    assert "".join(c.text for c in chunks) == ""
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert chunks[-1].usage.completion_tokens > 0


async def test_response_format_json_schema_over_grpc(chat):
    schema = City.model_json_schema()
    fmt = gateway_pb2.ResponseFormat(
        type="json_schema",
        json_schema=gateway_pb2.JsonSchemaFormat(name="city", schema=json.dumps(schema)),
    )
    chunks = await chat(
        messages=[{"role": "user", "content": "Name a city and its country, as JSON."}],
        options=gateway_pb2.CompletionOptions(temperature=0, max_tokens=48, response_format=fmt),
    )
    jsonschema.validate(json.loads("".join(c.text for c in chunks)), schema)
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_STOP


@pytest.mark.parametrize(
    ("tool", "choice", "problem"),
    [
        (
            proto_tool(WEATHER, parameters="{"),
            "required",
            "tools[0].function.parameters is not JSON",
        ),
        (
            proto_tool(WEATHER, parameters="[]"),
            "auto",
            "tools[0].function.parameters must be a JSON object",
        ),
        (proto_tool(WEATHER, parameters='{"type": "nope"}'), "required", 'Unsupported type "nope"'),
        (
            gateway_pb2.Tool(function=gateway_pb2.FunctionDefinition(name="a b")),
            "auto",
            "tools.0.function.name",
        ),
        (proto_tool(WEATHER), "sometimes", "tool_choice"),
    ],
)
async def test_a_bad_tool_is_invalid_argument_naming_the_problem(chat, tool, choice, problem):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await chat(tools=[tool], tool_choice=gateway_pb2.ToolChoice(mode=choice))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in caught.value.details()


async def test_auto_answers_stream_as_text_or_calls(chat):
    chunks = await chat(
        messages=[{"role": "user", "content": "Say hello."}],
        options=gateway_pb2.CompletionOptions(temperature=0, max_tokens=16),
        tools=[proto_tool(WEATHER)],
    )
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    if calls:  # the model may choose to call; then every call is whole JSON
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
        assert all(isinstance(json.loads(c.arguments), dict) for c in calls)
    else:
        assert "".join(c.text for c in chunks).strip()
        assert chunks[-1].finish_reason in (
            common_pb2.FINISH_REASON_STOP,
            common_pb2.FINISH_REASON_LENGTH,
        )
