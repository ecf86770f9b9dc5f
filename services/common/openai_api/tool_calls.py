"""Tool calls, the request side: the tools, the choice, the forced call's schema.

Done here and in the tokenizer service, never in the engine, so every backend
(native or vLLM) behaves the same:
- the messages (assistant tool_calls, whose content may be null, and "tool"
  messages) and the tools go to the tokenizer as fields; it renders them in
  the template's own tool format, or the fallback's for a template without
  one (services/common/chat_tools.py), and names the format of the answer;
- tool_choice "required" or a named function constrains the output with a
  JSON schema that admits only a valid call (forced_call_schema): one object
  {"name", "arguments"} whose arguments follow that function's parameters;
  no tag is needed then, the whole output is the call;
- "auto" leaves the output free and reads it for calls in the template's
  format (tool_parsers/); "none" sends no tools at all.
Calls come back as OpenAI's tool_calls (id "call_...", type "function",
function.arguments a JSON string) with finish_reason "tool_calls", once the
output filter has screened their decoded text (output_filter.screen_calls).
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from maas.v1 import tokenizer_pb2

MAX_TOOLS = 128
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


class NamedFunction(BaseModel):
    name: FunctionName


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    name: FunctionName
    arguments: str = Field(max_length=65_536)


class MessageToolCall(BaseModel):
    """A call in an assistant message of the history."""

    id: str = Field(max_length=128)
    type: Literal["function"] = "function"
    function: CalledFunction


def mode(tools: list[Tool] | None, choice: ToolChoice | None) -> str:
    """ "" (no tools), "auto" (parse the output) or "forced" (the grammar makes a call)."""
    if not tools or choice == "none":
        return ""
    return "auto" if choice in (None, "auto") else "forced"


def prompt_messages(messages) -> list[tokenizer_pb2.ChatMessage]:
    """schemas.ChatMessage as the tokenizer takes them, calls as fields."""
    return [
        tokenizer_pb2.ChatMessage(
            role=m.role,
            content=m.text(),
            name=m.name or "",
            tool_call_id=m.tool_call_id or "",
            tool_calls=[
                tokenizer_pb2.ToolCall(
                    id=c.id, name=c.function.name, arguments=c.function.arguments
                )
                for c in m.tool_calls or []
            ],
        )
        for m in messages
    ]


def tools_text(tools: list[Tool] | None, choice: ToolChoice | None) -> str:
    """The tools the prompt offers, as RenderChatRequest.tools carries them; "" for none."""
    if not mode(tools, choice):
        return ""
    return json.dumps([tool.model_dump(exclude_none=True) for tool in tools])


def forced_call_schema(tools: list[Tool], choice: ToolChoice) -> dict:
    """A JSON schema only a call of the allowed functions satisfies."""
    allowed = [
        tool.function
        for tool in tools
        if not isinstance(choice, NamedToolChoice) or tool.function.name == choice.function.name
    ]
    if not allowed:
        raise ValueError(f"tool_choice names {choice.function.name!r}, which is not in tools")
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function.name},
                "arguments": function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for function in allowed
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}
