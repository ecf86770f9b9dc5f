"""Tool calls, the request side: modes, the forced-call schema, what the tokenizer gets."""

import json

import jsonschema
import pytest

from maas_services.common.openai_api.tool_calls import (
    NamedToolChoice,
    Tool,
    forced_call_schema,
    mode,
    tools_text,
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


def test_tools_go_to_the_tokenizer_only_when_the_choice_lets_them():
    assert tools_text([WEATHER], "none") == tools_text(None, "auto") == ""
    (sent,) = json.loads(tools_text([WEATHER], "auto"))
    assert sent == WEATHER.model_dump(exclude_none=True)
