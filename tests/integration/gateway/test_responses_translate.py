"""Responses input items -> the chat messages the pipeline serves, and the stored conversation."""

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.responses.request import ResponsesRequest
from maas_services.gateway.responses.translate import translate


def turn(previous=None, **body):
    request = ResponsesRequest.model_validate({"model": "m", **body})
    return translate(request, "resp_test", previous, None)


def text(kind: str, value: str) -> dict:
    return {"type": kind, "text": value}


def roles(translated) -> list[tuple]:
    return [
        (m.role, m.content, [c.name for c in m.tool_calls], m.tool_call_id)
        for m in translated.parsed.prompt.messages
    ]


def test_items_become_messages_and_calls_join_the_assistant_message():
    translated = turn(
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [text("input_text", "Weather "), text("input_text", "twice?")],
            },
            {"type": "message", "role": "assistant", "content": [text("output_text", "Checking.")]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [text("input_text", "rain")],
            },
        ],
    )
    assert roles(translated) == [
        ("system", "Be brief.", [], ""),
        ("user", "Weather twice?", [], ""),
        ("assistant", "Checking.", ["weather", "weather"], ""),
        ("tool", "sunny", [], "c1"),
        ("tool", "rain", [], "c2"),
    ]
    assert translated.parsed.request_id == "resp_test"
    # What is stored for the next turn has no instructions (OpenAI does not carry them).
    assert [m["role"] for m in translated.conversation] == ["user", "assistant", "tool", "tool"]


def test_a_previous_conversation_comes_before_the_new_input():
    previous = [
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hi Ada."},
    ]
    translated = turn(previous, input="Who am I?", instructions="Answer.")
    assert [(r, c) for r, c, *_ in roles(translated)] == [
        ("system", "Answer."),
        ("user", "I am Ada."),
        ("assistant", "Hi Ada."),
        ("user", "Who am I?"),
    ]
    assert translated.conversation[-1] == {"role": "user", "content": "Who am I?"}


def test_a_conversation_over_the_message_cap_names_previous_response_id():
    previous = [{"role": "user", "content": "x"}] * 2048
    with pytest.raises(APIError) as caught:
        turn(previous, input="one more")
    assert caught.value.param == "previous_response_id"


def test_format_and_tool_errors_use_the_responses_names():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    with pytest.raises(APIError) as caught:
        turn(
            input="x",
            tools=tools,
            tool_choice="required",
            text={"format": {"type": "json_object"}},
        )
    assert caught.value.param == "text.format"
    assert "response_format" not in caught.value.message
    forced = turn(input="x", tools=tools, tool_choice={"type": "function", "name": "f"})
    assert forced.parsed.tool_mode == "forced"
    assert forced.parsed.sampling.HasField("grammar")
    schema = turn(
        input="x",
        max_output_tokens=7,
        text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
    )
    assert schema.parsed.grammar_param == "text.format"
    assert schema.parsed.sampling.max_tokens == 7
