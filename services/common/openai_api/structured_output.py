"""Structured outputs: the request's format fields -> the grammar the engine enforces.

OpenAI's `response_format` (json_object, json_schema) and vLLM's extras
(`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and
`structured_outputs` as vLLM now names them) all become one maas.v1.Grammar
on the engine's SamplingParams; at most one may be given. Whether the
grammar compiles is the tokenizer's to say (ValidateGrammar, before any
engine time); here only the shape is checked, and sizes are capped so that
a schema cannot cost more than the caps the compiler enforces.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from maas.v1 import common_pb2
from maas_services.common.grammar.spec import MAX_CHOICES, MAX_GRAMMAR_CHARS
from maas_services.common.openai_api.errors import bad_request
from maas_services.common.openai_api.tool_calls import forced_call_schema, mode

GrammarText = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)]
Choice = Annotated[str, Field(min_length=1, max_length=1024)]
Kind = common_pb2.Grammar


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    # OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64.
    name: str = Field(max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = Field(None, max_length=4096)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format of type "json_schema" needs json_schema')
        return self


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs object: exactly one of its fields."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_: dict[str, Any] | GrammarText | None = Field(None, alias="json")
    regex: GrammarText | None = None
    choice: list[Choice] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: GrammarText | None = None


class StructuredFields(BaseModel):
    """The format fields, mixed into SamplingFields (schemas.py)."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | GrammarText | None = None
    guided_regex: GrammarText | None = None
    guided_choice: list[Choice] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    guided_grammar: GrammarText | None = None
    structured_outputs: StructuredOutputs | None = None


def grammar_of(req: StructuredFields) -> tuple[common_pb2.Grammar, str] | None:
    """(the grammar, the field it came from), None for free text; APIError 400 on a conflict."""
    found = [g for g in _candidates(req) if g is not None]
    if len(found) > 1:
        names = ", ".join(param for _, param in found)
        raise bad_request(f"give at most one output format; got {names}", param=found[1][1])
    return found[0] if found else None


def _candidates(req: StructuredFields):
    # Chat requests only have tools; "required" or a named function forces a call.
    tools, choice = getattr(req, "tools", None), getattr(req, "tool_choice", None)
    if mode(tools, choice) == "forced":
        try:
            yield _json_schema(forced_call_schema(tools, choice), "tool_choice")
        except ValueError as exc:
            raise bad_request(str(exc), param="tool_choice") from None
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        yield Kind(kind=Kind.KIND_JSON_OBJECT), "response_format"
    if fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_
        yield _json_schema(schema if schema is not None else {}, "response_format")
    yield _guided(
        req.guided_json, req.guided_regex, req.guided_choice, req.guided_grammar, "guided"
    )
    so = req.structured_outputs
    if so is not None:
        yield _guided(so.json_, so.regex, so.choice, so.grammar, "structured_outputs")


def _guided(json_, regex, choice, grammar, prefix: str):
    given = [
        (value, name)
        for value, name in [
            (json_, "json"),
            (regex, "regex"),
            (choice, "choice"),
            (grammar, "grammar"),
        ]
        if value is not None
    ]
    if not given:
        return None
    param = lambda name: f"{prefix}_{name}" if prefix == "guided" else f"{prefix}.{name}"  # noqa: E731
    if len(given) > 1:
        raise bad_request(
            f"give at most one of {', '.join(param(n) for _, n in given)}", param=param(given[1][1])
        )
    value, name = given[0]
    if name == "json":
        return _json_schema(value, param(name))
    if name == "regex":
        return Kind(kind=Kind.KIND_REGEX, text=value), param(name)
    if name == "choice":
        return Kind(kind=Kind.KIND_CHOICE, text=_capped(json.dumps(value), param(name))), param(
            name
        )
    return Kind(kind=Kind.KIND_EBNF, text=value), param(name)


def _json_schema(schema: dict | str, param: str):
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return Kind(kind=Kind.KIND_JSON_SCHEMA, text=_capped(text, param, "the JSON schema")), param


def _capped(text: str, param: str, what: str = "the choice list") -> str:
    # The tokenizer's cap (spec.py), here so that no oversized grammar is sent on.
    if len(text) > MAX_GRAMMAR_CHARS:
        raise bad_request(
            f"{what} is {len(text)} characters; at most {MAX_GRAMMAR_CHARS}", param=param
        )
    return text
