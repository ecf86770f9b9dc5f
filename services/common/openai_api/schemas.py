"""OpenAI request bodies, validated.

Field names and ranges follow OpenAI's API; the extras vLLM accepts (top_k,
min_p, repetition_penalty, min_tokens, ignore_eos) are accepted under vLLM's
names because benchmark tools send them. Unknown fields are ignored, as
OpenAI-compatible servers commonly do, so newer SDKs keep working.

Every list has a realistic `max_length` and stops at its first bad element
(`fail_fast`), and a list too long is refused before its items are validated:
the gateway faces the internet, and a list of a million bad items must cost
one error, not a million (pydantic collects one error object per element
otherwise). The body's size and JSON shape are bounded before it
is decoded (body_guard.py, body_shape.py); these limits bound the rest.
"""

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from maas_services.common.openai_api.structured_output import StructuredFields
from maas_services.common.openai_api.tool_calls import MAX_TOOLS, MessageToolCall, Tool, ToolChoice

INT32_MAX = 2**31 - 1
# The largest context of any model we serve, as token ids.
MAX_PROMPT_IDS = 131_072
MAX_MESSAGES = 2048
# OpenAI's limit on prompts in one legacy completions request.
MAX_PROMPTS = 2048
MAX_CONTENT_PARTS = 256
MAX_STOP_STRINGS = 16
# The engine matches stop strings as each token arrives; longer ones are abuse.
MAX_STOP_CHARS = 256
# Deployment names are Kubernetes names (at most 253 characters).
MAX_MODEL_CHARS = 256


def _encodable(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"): valid JSON, but no UTF-8
    # encoding exists, so the protobuf layer would fail on them later.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_encodable)]
# Values that travel in int32 protobuf fields.
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopText = Annotated[Text, Field(max_length=MAX_STOP_CHARS)]


def _at_most(max_length: int):
    # pydantic checks max_length only after validating every item (measured:
    # 87,000 messages cost 35 MB before "at most 2048"), so count them first.
    def check(value):
        if isinstance(value, list) and len(value) > max_length:
            raise PydanticCustomError(
                "too_long",
                "List should have at most {max_length} items",
                {"max_length": max_length},
            )
        return value

    return BeforeValidator(check)


def bounded_list(item, max_length: int, min_length: int = 0):
    return Annotated[
        list[item],
        Field(min_length=min_length, max_length=max_length, fail_fast=True),
        _at_most(max_length),
    ]


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Clients send a string or a list of text parts; both mean the same text.
    content: Text | bounded_list(TextPart, MAX_CONTENT_PARTS) | None = None
    name: Text | None = None
    # Tool use (tool_calls.py): an assistant's calls, a tool's answer to one.
    tool_calls: bounded_list(MessageToolCall, MAX_TOOLS) | None = None
    tool_call_id: Text | None = Field(None, max_length=128)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(StructuredFields):  # response_format, guided_*: structured_output.py
    model_config = ConfigDict(extra="ignore")

    model: Text = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, gt=0, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stop: StopText | bounded_list(StopText, MAX_STOP_STRINGS) | None = None
    seed: int | None = Field(None, ge=0, lt=2**64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: Text | None = None
    # vLLM's extras.
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    # maas's own extra: opt in to speculative decoding where the engine runs it.
    speculative: bool = False

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def top_logprobs_count(self) -> int | None:
        """None when logprobs are off, else how many alternatives per token."""
        raise NotImplementedError

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: bounded_list(ChatMessage, MAX_MESSAGES, min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: bounded_list(Tool, MAX_TOOLS) | None = None
    tool_choice: ToolChoice | None = None

    @property
    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _prefer_max_completion_tokens(self) -> "ChatCompletionRequest":
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(SamplingFields):
    # A string, a one-element list of strings, or token ids.
    prompt: Text | bounded_list(Text, MAX_PROMPTS) | bounded_list(Int32, MAX_PROMPT_IDS)
    echo: bool = False
    # The legacy API's logprobs is the number of alternatives (0-5), or null.
    logprobs: int | None = Field(None, ge=0, le=5)

    @property
    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], str) and len(value) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value
