"""Structured outputs through the whole stack, with the official openai SDK."""

import json

import grpc
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from maas_services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0)


def test_parse_returns_the_pydantic_object(client):
    reply = client.chat.completions.parse(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Name a city and its country, as JSON."}],
        response_format=City,
        temperature=0,
        max_tokens=48,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)


def test_an_invalid_schema_is_a_400_from_the_tokenizer_before_the_engine(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "nope"}},
            },
        )
    error = caught.value.body
    assert error["param"] == "response_format"
    # The tokenizer's wording; the engine's would start "grammar: ".
    assert error["message"].startswith('invalid json_schema: Unsupported type "nope"')


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
# A finished round trip in the history: the assistant's call (content null) and the answer.
HISTORY = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Oslo", "unit": "celsius"}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    {"role": "user", "content": "And in Paris?"},
]


def test_required_tool_calls_validate_whole_and_streamed(client):
    kwargs = dict(
        model=DEFAULT_MODEL_ID,
        messages=HISTORY,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=48,
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls"
    (call,) = whole.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.index for tc in streamed] == [0]
    assert streamed[0].function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_the_grpc_front_carries_the_guided_fields(stack):
    async with grpc.aio.insecure_channel(stack.gateway_grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        def chat(**options):
            return stub.ChatCompletion(
                gateway_pb2.ChatCompletionRequest(
                    model=DEFAULT_MODEL_ID,
                    messages=[tokenizer_pb2.ChatMessage(role="user", content="Is it raining?")],
                    options=gateway_pb2.CompletionOptions(temperature=0, max_tokens=8, **options),
                ),
                metadata=[("authorization", f"Bearer {stack.api_key}")],
            )

        chunks = [c async for c in chat(guided_choice=["yes", "no"])]
        assert "".join(c.text for c in chunks) in ("yes", "no")
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            _ = [c async for c in chat(guided_regex="[a-")]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid regex" in caught.value.details()
