"""Tool calls: the forced-call schema, and parsing whole and streamed outputs."""

import json

import jsonschema
import pytest

from services.gateway.tool_calls import (
    MessageToolCall,
    NamedToolChoice,
    Tool,
    ToolCallStream,
    forced_call_schema,
    history_text,
    mode,
    parse_output,
)

WEATHER = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
)
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time"}})
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_modes():
    assert mode(None, "required") == ""
    assert mode([WEATHER], "none") == ""
    assert mode([WEATHER], None) == mode([WEATHER], "auto") == "auto"
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    assert mode([WEATHER], "required") == mode([WEATHER], named) == "forced"


def test_the_forced_schema_admits_only_calls_of_the_allowed_functions():
    schema = forced_call_schema([WEATHER, TIME], "required")
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)
    jsonschema.validate({"name": "get_time", "arguments": {}}, schema)
    for bad in [{"name": "get_weather", "arguments": {}}, {"name": "nope", "arguments": {}}]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
            forced_call_schema([WEATHER, TIME], named),
        )
    missing = NamedToolChoice.model_validate({"type": "function", "function": {"name": "x"}})
    with pytest.raises(ValueError, match="not in tools"):
        forced_call_schema([WEATHER], missing)


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        ("It is sunny.", "It is sunny.", []),
        (CALL, None, ["get_weather"]),
        ("Let me check. " + CALL + CALL, "Let me check. ", ["get_weather", "get_weather"]),
        ("<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
        ('<tool_call>{"name": "x"', '<tool_call>{"name": "x"', []),
        ("a < b <tool", "a < b <tool", []),
    ],
)
def test_auto_parsing_of_fixed_strings(text, content, names):
    got_content, calls = parse_output(text, forced=False)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_forced_output_is_one_call():
    content, calls = parse_output('{"name": "get_time", "arguments": {}}', forced=True)
    assert content is None and [c["function"] for c in calls] == [
        {"name": "get_time", "arguments": "{}"}
    ]


def test_streamed_calls_come_whole_with_stable_indexes_whatever_the_cut():
    text = "Sure. " + CALL + " and " + CALL
    for cut in range(1, len(text)):
        stream = ToolCallStream(forced=False)
        pieces = [stream.push(text[:cut]), stream.push(text[cut:]), stream.finish()]
        content = "".join(c for c, _ in pieces)
        calls = [call for _, cs in pieces for call in cs]
        assert content == "Sure.  and ", cut
        assert [c["index"] for c in calls] == [0, 1]


def test_history_calls_are_written_in_the_prompt_format():
    call = MessageToolCall.model_validate(
        {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    )
    assert history_text("", [call]) == CALL
    assert parse_output(history_text("", [call]), forced=False)[1][0]["function"]["name"] == (
        "get_weather"
    )


@pytest.mark.parametrize("forced", [False, True])
def test_a_call_200k_tokens_long_is_held_whole_and_parsed_once(forced):
    # The worst case for the per-token path: one call held until it closes
    # (auto) or the output ends (forced). Its speed is not asserted here (no
    # timed tests); held text kept in parts made it 0.35 s, a copy per token 22 s.
    stream = ToolCallStream(forced)
    opening = '{"name": "f", "arguments": {"a": "'
    assert stream.push(opening if forced else "<tool_call>" + opening) == ("", [])
    for _ in range(200_000):
        assert stream.push("xy") == ("", [])
    content, calls = stream.push('"}}' + ("" if forced else "</tool_call>"))
    tail, more = stream.finish()
    assert content == tail == ""
    ((call,),) = [calls + more]
    assert json.loads(call["function"]["arguments"]) == {"a": "xy" * 200_000}
