"""The gRPC chat fields become the same request the HTTP API's JSON does."""

import json

import pytest

from maas.v1 import gateway_pb2, tokenizer_pb2
from maas_services.common.chat_messages import message_dict
from maas_services.common.openai_api.body_shape import MAX_ITEMS
from maas_services.common.openai_api.schemas import ChatCompletionRequest
from maas_services.gateway.grpc_api.grpc_chat import (
    FieldError,
    check_json_fields,
    json_object,
    response_format_dict,
    tool_choice_value,
    tool_dicts,
)

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
HTTP_BODY = {
    "model": "m",
    "messages": [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": PARAMETERS},
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
}


def test_the_grpc_fields_validate_into_the_http_request():
    messages = [
        tokenizer_pb2.ChatMessage(
            role="assistant", tool_calls=[tokenizer_pb2.ToolCall(id="c1", name="f", arguments="{}")]
        ),
        tokenizer_pb2.ChatMessage(role="tool", tool_call_id="c1", content="done"),
    ]
    tool = gateway_pb2.Tool(
        function=gateway_pb2.FunctionDefinition(
            name="f", description="d", parameters=json.dumps(PARAMETERS)
        )
    )
    fmt = gateway_pb2.ResponseFormat(
        type="json_schema", json_schema=gateway_pb2.JsonSchemaFormat(name="s", schema="{}")
    )
    from_grpc = ChatCompletionRequest(
        model="m",
        messages=(message_dict(m, lazy_calls=True) for m in messages),
        tools=tool_dicts([tool]),
        tool_choice=tool_choice_value(gateway_pb2.ToolChoice(function="f")),
        response_format=response_format_dict(fmt),
    )
    assert from_grpc == ChatCompletionRequest.model_validate(HTTP_BODY)


def test_tool_choice_modes_and_unset():
    assert tool_choice_value(gateway_pb2.ToolChoice(mode="required")) == "required"
    assert tool_choice_value(gateway_pb2.ToolChoice()) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{", "is not JSON"), ("[1]", "must be a JSON object"), ("3", "must be a JSON object")],
)
def test_json_text_that_is_not_an_object_is_refused_by_field(text, problem):
    fmt = gateway_pb2.ResponseFormat(
        type="json_schema", json_schema=gateway_pb2.JsonSchemaFormat(name="s", schema=text)
    )
    with pytest.raises(FieldError, match=f"json_schema.schema {problem}"):
        response_format_dict(fmt)


def test_json_fields_are_bounded_together_before_any_is_decoded():
    # Worst case within one gRPC message: many tools, each just under the one-body
    # bound, that would decode to ~95 MB of lists together.
    flood = "[" + ",".join(["[]"] * (MAX_ITEMS // 4)) + "]"
    tools = [
        gateway_pb2.Tool(
            type="function", function=gateway_pb2.FunctionDefinition(name=f"f{i}", parameters=flood)
        )
        for i in range(8)
    ]
    check_json_fields(tools[:1], gateway_pb2.CompletionOptions())
    with pytest.raises(FieldError, match="more than"):
        check_json_fields(tools, gateway_pb2.CompletionOptions())


def test_a_deeply_nested_parameters_text_is_refused_not_a_crash():
    with pytest.raises(FieldError, match="nested too deeply"):
        json_object("[" * 200_000 + "]" * 200_000, "tools[0].function.parameters")
