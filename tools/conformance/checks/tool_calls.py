"""Function tools: a forced call comes back as tool_calls whose arguments are JSON.

tool_choice naming a function makes the model call it (the reference's
"forces the model to call that tool"). Unstreamed: message.tool_calls[] with
id, type "function", function.name and function.arguments, a JSON string.
Streamed: delta.tool_calls[] fragments, each with the `index` of the call it
continues; the first fragment of a call carries its id, type and name, and the
argument fragments of one index concatenate to that JSON. The arguments must
hold to the function's parameters schema.
"""

import json

import jsonschema

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import CheckFailed, expect
from maas_tools.conformance.shapes import ask
from maas_tools.conformance.target import Target

NAME = "get_weather"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
REQUEST = {
    "messages": ask("What is the weather in Paris right now?"),
    "tools": [
        {
            "type": "function",
            "function": {
                "name": NAME,
                "description": "The current weather in a city.",
                "parameters": PARAMETERS,
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": NAME}},
    "max_tokens": 128,
    "temperature": 0,
}
# With a named tool_choice OpenAI answers "stop"; with "auto"/"required", "tool_calls".
ENDINGS = ("tool_calls", "stop")


def arguments(text: str, where: str) -> dict:
    try:
        args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"{where}: arguments are not JSON: {text!r:.160}") from exc
    expect(isinstance(args, dict), f"{where}: arguments are a JSON object, got {text!r:.120}")
    try:
        jsonschema.validate(args, PARAMETERS)
    except jsonschema.ValidationError as exc:
        raise CheckFailed(f"{where}: arguments break the parameters schema: {exc.message}") from exc
    return args


def call_head(call: dict, where: str) -> None:
    expect(isinstance(call.get("id"), str) and call["id"], f"{where}: id is a non-empty string")
    expect(call.get("type") == "function", f"{where}: type is 'function', got {call.get('type')!r}")
    name = (call.get("function") or {}).get("name")
    expect(name == NAME, f"{where}: function.name is {NAME!r}, got {name!r}")


@check("tool_calls", "message")
def message(target: Target) -> str:
    choice = target.chat(**REQUEST)["choices"][0]
    calls = choice["message"].get("tool_calls")
    expect(
        calls, f"tool_choice named {NAME!r} but no tool_calls came back: {choice['message']!r:.160}"
    )
    for i, call in enumerate(calls):
        call_head(call, f"tool_calls[{i}]")
        expect(
            isinstance(call["function"].get("arguments"), str),
            f"tool_calls[{i}].function.arguments is a JSON string",
        )
        arguments(call["function"]["arguments"], f"tool_calls[{i}]")
    reason = choice.get("finish_reason")
    expect(reason in ENDINGS, f"finish_reason is one of {ENDINGS}, got {reason!r}")
    return calls[0]["function"]["arguments"]


@check("tool_calls", "streamed")
def streamed(target: Target) -> str:
    chunks = target.stream(**REQUEST).chunks
    calls: dict[int, list[dict]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for fragment in choice["delta"].get("tool_calls") or []:
                index = fragment.get("index")
                expect(
                    isinstance(index, int),
                    f"every streamed tool_calls fragment has an integer index: {fragment!r:.120}",
                )
                calls.setdefault(index, []).append(fragment)
    expect(calls, f"tool_choice named {NAME!r} but no delta carried tool_calls")
    expect(
        sorted(calls) == list(range(len(calls))),
        f"tool call indices count from 0, got {sorted(calls)}",
    )
    for index, fragments in calls.items():
        call_head(fragments[0], f"call {index}'s first fragment")
        text = "".join((f.get("function") or {}).get("arguments") or "" for f in fragments)
        arguments(text, f"call {index}'s concatenated fragments")
    reasons = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c.get("finish_reason")]
    expect(reasons and reasons[-1] in ENDINGS, f"finish_reason is one of {ENDINGS}, got {reasons}")
    return f"{len(calls)} call(s), {sum(map(len, calls.values()))} fragments"
