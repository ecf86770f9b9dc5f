"""response_format: json_object gives valid JSON, json_schema gives JSON that holds.

The reference: `{"type": "json_object"}` ensures the message is valid JSON;
`{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`
ensures it matches the schema. A reply cut at max_tokens (finish_reason
"length") may be incomplete by the reference's own words, so the requests
leave room and such a reply is reported as a failure to finish.
"""

import json

import jsonschema

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import CheckFailed, expect
from maas_tools.conformance.target import Target

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": "Name the capital of France and its country, as JSON."},
]


def json_reply(target: Target, response_format: dict) -> object:
    choice = target.chat(
        messages=MESSAGES, max_tokens=160, temperature=0, response_format=response_format
    )["choices"][0]
    text = choice["message"].get("content") or ""
    expect(
        choice.get("finish_reason") != "length",
        f"the JSON did not finish within max_tokens: {text!r:.160}",
    )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"the content is not JSON: {text!r:.160}") from exc


@check("response_format", "json_object")
def json_object(target: Target) -> str:
    value = json_reply(target, {"type": "json_object"})
    expect(
        isinstance(value, dict), f"json_object: the content is a JSON object, got {value!r:.120}"
    )
    return json.dumps(value)[:80]


@check("response_format", "json_schema")
def json_schema(target: Target) -> str:
    value = json_reply(
        target,
        {
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": SCHEMA, "strict": True},
        },
    )
    try:
        jsonschema.validate(value, SCHEMA)
    except jsonschema.ValidationError as exc:
        raise CheckFailed(f"json_schema: the content breaks the schema: {exc.message}") from exc
    return json.dumps(value)[:80]
