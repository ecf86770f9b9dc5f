"""The chat RPC's tool and format fields, to and from the HTTP API's shapes.

In: tools, tool_choice and response_format (the messages: common/chat_messages.py)
become the dicts that the HTTP API's pydantic models validate, so both fronts
accept, refuse and render exactly the same requests. Protobuf
has no JSON value type, so a schema or a function's parameters travel as JSON
text; text that is not a JSON object is refused here, naming its field. Out:
the calls read from the answer (tool_calls.py) become ToolCallDelta messages,
once they passed the output filter (openai_format.screen_calls).
"""

import json
from collections.abc import Iterable

from maas.v1 import gateway_pb2
from maas_services.common.openai_api.body_shape import MAX_ITEMS, json_items


class FieldError(ValueError):
    """A field the caller sent that cannot be read: INVALID_ARGUMENT."""


def check_json_fields(tools: Iterable[gateway_pb2.Tool], options) -> None:
    """Bound the request's JSON-text fields together before any is decoded.

    Over HTTP the body's shape is bounded before json.loads (body_shape.py);
    here the same bound covers every schema and parameters text of one request,
    so many fields just under it cannot add up to what one body may not.
    """
    texts = [tool.function.parameters for tool in tools]
    if options.HasField("response_format"):
        texts.append(options.response_format.json_schema.schema)
    if sum(json_items(text.encode()) for text in texts if text) > MAX_ITEMS:
        raise FieldError(
            f"the request's JSON schemas have more than {MAX_ITEMS} arrays, objects and elements"
        )


def tool_dicts(tools: Iterable[gateway_pb2.Tool]) -> Iterable[dict]:
    for index, tool in enumerate(tools):
        function = {"name": tool.function.name}
        if tool.function.description:
            function["description"] = tool.function.description
        if tool.function.parameters:
            param = f"tools[{index}].function.parameters"
            function["parameters"] = json_object(tool.function.parameters, param)
        yield {"type": tool.type or "function", "function": function}


def tool_choice_value(choice: gateway_pb2.ToolChoice) -> str | dict | None:
    which = choice.WhichOneof("choice")
    if which == "function":
        return {"type": "function", "function": {"name": choice.function}}
    return choice.mode if which == "mode" else None


def response_format_dict(fmt: gateway_pb2.ResponseFormat) -> dict:
    out: dict = {"type": fmt.type}
    if fmt.HasField("json_schema"):
        given = fmt.json_schema
        out["json_schema"] = {"name": given.name}
        if given.strict:  # proto3 cannot tell false from unset; unset is the HTTP default
            out["json_schema"]["strict"] = True
        if given.description:
            out["json_schema"]["description"] = given.description
        if given.schema:
            out["json_schema"]["schema"] = json_object(
                given.schema, "options.response_format.json_schema.schema"
            )
    return out


def json_object(text: str, param: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FieldError(f"{param} is not JSON: {exc}") from None
    except RecursionError:
        raise FieldError(f"{param} is nested too deeply") from None
    if not isinstance(value, dict):
        raise FieldError(f"{param} must be a JSON object")
    return value


def call_deltas(calls: list[dict]) -> list[gateway_pb2.ToolCallDelta]:
    """tool_calls.tool_call dicts, each with its index, as the chunk carries them."""
    return [
        gateway_pb2.ToolCallDelta(
            index=call["index"],
            id=call["id"],
            type=call["type"],
            name=call["function"]["name"],
            arguments=call["function"]["arguments"],
        )
        for call in calls
    ]
