"""The body of POST /v1/responses, validated.

Shapes follow OpenAI's Responses API (the openai SDK's
types/responses/response_create_params.py). What maas cannot serve is
refused by name, never dropped silently: an item, content part, tool or
tool_choice of an unsupported type is a 400 whose `param` is the path to its
`type` (`input.3.type`, `tools.0.type`); so are reasoning, background,
conversation and prompt. Unknown fields are ignored, as on the chat route.

Every list is bounded and counted before its items are validated, as in
schemas.py; the body's bytes and JSON shape are bounded before this runs
(body_guard.py, body_shape.py).
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from maas_services.common.openai_api.schemas import (
    INT32_MAX,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_MODEL_CHARS,
    Text,
    bounded_list,
)
from maas_services.common.openai_api.structured_output import JsonSchemaFormat
from maas_services.common.openai_api.tool_calls import MAX_TOOLS, FunctionName

# Items that need what maas does not run (a reasoning model, server-side item
# references), refused with the reason; other unknown types are refused by name.
UNSUPPORTED_ITEMS = {
    "reasoning": "reasoning items are not supported: the served models do not reason",
    "item_reference": "item_reference is not supported: send the item itself, or chain"
    " with previous_response_id",
}
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]
BUILT_IN = "only function tools (type 'function') run here, no built-in tools"


def text_or(items):
    """A string or a list, told apart before validation: an error then names
    the branch the value took (`input.3.type`), not every branch it did not."""
    return Annotated[
        Annotated[Text, Tag("Str")] | Annotated[items, Tag("List")],
        Discriminator(lambda value: "Str" if isinstance(value, str) else "List"),
    ]


def _refuse_type(kind: str, allowed: tuple[str, ...], what: str) -> None:
    if kind not in allowed:
        raise ValueError(
            f"{what} of type {kind!r} are not supported; supported: "
            + ", ".join(repr(a) for a in allowed)
        )


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: Text

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind in ("input_image", "input_file", "input_audio"):
            raise ValueError(f"content parts of type {kind!r} are not supported: text only")
        _refuse_type(kind, ("input_text", "output_text"), "content parts")
        return kind


class InputItem(BaseModel):
    """One input item: a message, a function call or a call's output (by `type`)."""

    model_config = ConfigDict(extra="ignore")

    # First, so that an unknown type is the error reported (the first one is).
    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: text_or(bounded_list(ContentPart, MAX_CONTENT_PARTS)) | None = None
    call_id: str | None = Field(None, min_length=1, max_length=128)
    name: FunctionName | None = None
    arguments: str | None = Field(None, max_length=65_536)
    output: text_or(bounded_list(ContentPart, MAX_CONTENT_PARTS)) | None = None

    @field_validator("type")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind in UNSUPPORTED_ITEMS:
            raise ValueError(UNSUPPORTED_ITEMS[kind])
        _refuse_type(kind, ("message", "function_call", "function_call_output"), "input items")
        return kind

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> "InputItem":
        needed = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
        }[self.type]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"an item of type {self.type!r} needs {', '.join(missing)}")
        return self

    def text(self) -> str:
        value = self.content if self.type == "message" else self.output
        if isinstance(value, str):
            return value
        return "".join(part.text for part in value)


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("type")
    @classmethod
    def _function_only(cls, kind: str) -> str:
        if kind != "function":
            raise ValueError(f"tools of type {kind!r} are not supported: {BUILT_IN}")
        return kind


class FunctionChoice(BaseModel):
    type: str
    name: FunctionName | None = None

    @field_validator("type")
    @classmethod
    def _function_only(cls, kind: str) -> str:
        if kind != "function":
            raise ValueError(f"tool_choice of type {kind!r} is not supported: {BUILT_IN}")
        return kind

    @model_validator(mode="after")
    def _named(self) -> "FunctionChoice":
        if self.name is None:
            raise ValueError("a tool_choice of type 'function' needs name")
        return self


class TextFormat(BaseModel):
    """text.format: the flat form of chat's response_format."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a format of type 'json_schema' needs name and schema")
        if self.type == "json_schema":
            # The chat route's rules for the name (OpenAI's: [a-zA-Z0-9_-]{1,64}).
            JsonSchemaFormat(name=self.name, schema=self.schema_)
        return self


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: str | None = None

    @field_validator("effort")
    @classmethod
    def _none(cls, effort: str | None) -> str | None:
        if effort is not None and effort != "none":
            raise ValueError("reasoning is not supported: the served models do not reason")
        return effort


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    input: text_or(bounded_list(InputItem, MAX_MESSAGES))
    instructions: Text | None = None
    tools: bounded_list(FunctionTool, MAX_TOOLS) | None = None
    tool_choice: (
        Annotated[
            Annotated[Literal["none", "auto", "required"], Tag("Str")]
            | Annotated[FunctionChoice, Tag("Object")],
            Discriminator(lambda value: "Str" if isinstance(value, str) else "Object"),
        ]
        | None
    ) = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, gt=0, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=64)
    # OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512.
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=16)
    user: Text | None = None
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    @field_validator("background")
    @classmethod
    def _foreground(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("background responses are not supported; stream instead")
        return value

    @field_validator("conversation")
    @classmethod
    def _no_conversation(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("conversation is not supported: chain with previous_response_id")
        return value

    @field_validator("prompt")
    @classmethod
    def _no_prompt(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(
                "prompt (a stored prompt template) is not supported: send its text as input"
                " or instructions"
            )
        return value
