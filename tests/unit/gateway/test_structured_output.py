"""Request format fields -> the grammar on the engine's SamplingParams."""

import json

import pytest
from pydantic import ValidationError

from maas.v1 import common_pb2
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.parsed_request import chat_request
from maas_services.common.openai_api.schemas import ChatCompletionRequest

Kind = common_pb2.Grammar
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def body(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def grammar(**fields) -> tuple[common_pb2.Grammar | None, str]:
    parsed = chat_request(body(**fields), None)
    found = parsed.sampling.grammar if parsed.sampling.HasField("grammar") else None
    return found, parsed.grammar_param


@pytest.mark.parametrize(
    ("fields", "kind", "text", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA},
                }
            },
            Kind.KIND_JSON_SCHEMA,
            json.dumps(SCHEMA),
            "response_format",
        ),
        (
            {"response_format": {"type": "json_object"}},
            Kind.KIND_JSON_OBJECT,
            "",
            "response_format",
        ),
        ({"guided_json": SCHEMA}, Kind.KIND_JSON_SCHEMA, json.dumps(SCHEMA), "guided_json"),
        (
            {"guided_json": json.dumps(SCHEMA)},
            Kind.KIND_JSON_SCHEMA,
            json.dumps(SCHEMA),
            "guided_json",
        ),
        ({"guided_regex": "[0-9]+"}, Kind.KIND_REGEX, "[0-9]+", "guided_regex"),
        ({"guided_choice": ["a", "b"]}, Kind.KIND_CHOICE, '["a", "b"]', "guided_choice"),
        ({"guided_grammar": 'root ::= "x"'}, Kind.KIND_EBNF, 'root ::= "x"', "guided_grammar"),
        (
            {"structured_outputs": {"choice": ["yes"]}},
            Kind.KIND_CHOICE,
            '["yes"]',
            "structured_outputs.choice",
        ),
        (
            {"structured_outputs": {"json": SCHEMA}},
            Kind.KIND_JSON_SCHEMA,
            json.dumps(SCHEMA),
            "structured_outputs.json",
        ),
    ],
)
def test_each_format_field_becomes_one_grammar(fields, kind, text, param):
    found, named = grammar(**fields)
    assert (found.kind, found.text, named) == (kind, text, param)


def test_text_and_no_format_leave_the_output_free():
    assert grammar(response_format={"type": "text"}) == (None, "")
    assert grammar() == (None, "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        (
            {"structured_outputs": {"regex": "a", "grammar": 'root ::= "a"'}},
            "structured_outputs.grammar",
        ),
    ],
)
def test_two_formats_are_refused_naming_the_second(fields, param):
    with pytest.raises(APIError) as caught:
        grammar(**fields)
    assert caught.value.status == 400 and caught.value.param == param


def test_sizes_are_bounded_before_anything_compiles():
    huge = {"type": "object", "description": "x" * 70_000}
    with pytest.raises(APIError, match="at most 65536") as caught:
        grammar(guided_json=huge)
    assert caught.value.param == "guided_json"
    with pytest.raises(ValidationError):
        body(guided_choice=["a"] * 2000)
    # The worst list the schema admits (1024 strings of 1024) is ~1 MB as a
    # grammar: refused here, not sent on to the tokenizer to refuse.
    for field, param in [
        ({"guided_choice": ["x" * 1024] * 1024}, "guided_choice"),
        ({"structured_outputs": {"choice": ["x" * 1024] * 1024}}, "structured_outputs.choice"),
    ]:
        with pytest.raises(APIError, match="choice list is .* at most 65536") as caught:
            grammar(**field)
        assert caught.value.param == param
    with pytest.raises(ValidationError, match="needs json_schema"):
        body(response_format={"type": "json_schema"})
