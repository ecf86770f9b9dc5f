"""Tool calls for models whose chat template has no tool format of its own.

The bundled SmolLM2 template is plain ChatML. The fallback, done here in the
gateway so every backend (native or vLLM) behaves the same:
- the tools are described in the system prompt (system_text), which asks for
  each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- calls in the history (assistant tool_calls, whose content may be null) are
  written back in that form (history_text), and "tool" messages go to the
  template under their own role;
- tool_choice "required" or a named function constrains the output with a
  JSON schema that admits only a valid call (forced_call_schema): one object
  {"name", "arguments"} whose arguments follow that function's parameters;
  the tag is not needed then, the whole output is the call;
- "auto" leaves the output free and parses it for tagged calls (parse_output,
  or ToolCallStream as it streams); "none" sends no tools at all.
Calls come back as OpenAI's tool_calls (id "call_...", type "function",
function.arguments a JSON string) with finish_reason "tool_calls".
"""

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from maas.v1 import tokenizer_pb2

OPEN, CLOSE = "<tool_call>", "</tool_call>"
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


def prompt_messages(messages, tools: list[Tool] | None, choice: ToolChoice | None):
    """The conversation for the tokenizer: tools in the system prompt, calls as text.

    `messages` are schemas.ChatMessage; the calls also travel as fields, for
    templates with a tool format of their own.
    """
    out = [
        tokenizer_pb2.ChatMessage(
            role=m.role,
            content=history_text(m.text(), m.tool_calls or []),
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
    if mode(tools, choice):
        text = system_text(tools)
        if out and out[0].role == "system":
            out[0].content = f"{text}\n\n{out[0].content}"
        else:
            out.insert(0, tokenizer_pb2.ChatMessage(role="system", content=text))
    return out


def system_text(tools: list[Tool]) -> str:
    listed = "\n".join(json.dumps(tool.function.model_dump(exclude_none=True)) for tool in tools)
    return (
        "You may call these functions:\n"
        f"{listed}\n"
        f"To call one, answer with {OPEN}"
        '{"name": <function name>, "arguments": <arguments as a JSON object>}'
        f"{CLOSE}, one per call, and nothing else."
    )


def history_text(content: str, calls: list[MessageToolCall]) -> str:
    return "".join([content, *(_written(call) for call in calls)])


def _written(call: MessageToolCall) -> str:
    # The client's arguments text as it is: it is what the model wrote.
    arguments = call.function.arguments or "{}"
    return f'{OPEN}{{"name": {json.dumps(call.function.name)}, "arguments": {arguments}}}{CLOSE}'


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


def tool_call(name: str, arguments: Any, index: int | None = None) -> dict:
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return call if index is None else {"index": index, **call}


def _call_of(text: str) -> tuple[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return value["name"], value.get("arguments", {})


def parse_output(text: str, forced: bool) -> tuple[str | None, list[dict]]:
    """(the content left, the calls) of a whole output."""
    stream = ToolCallStream(forced)
    content, calls = stream.push(text)
    tail, more = stream.finish()
    content += tail
    calls = [{k: v for k, v in call.items() if k != "index"} for call in calls + more]
    return (content or None) if calls else content, calls


class ToolCallStream:
    """One choice's text as it streams: content outside calls, and each call once whole.

    Text that may be the start of OPEN is held back until it is clear; a call
    whose JSON does not parse is passed on as content, as the model wrote it.
    Calls are numbered from 0 in order (their `index` in stream deltas).
    """

    def __init__(self, forced: bool):
        self.forced = forced
        self.calls = 0
        self._held = ""
        # Per token, no copy of what is held: a forced output, or a call not yet
        # closed, is kept in parts and joined once; only the end of a call's parts
        # (_tail) is searched for CLOSE as each token comes.
        self._parts: list[str] = []
        self._tail = ""

    def push(self, text: str) -> tuple[str, list[dict]]:
        if self.forced:
            self._parts.append(text)
            return "", []
        if self._parts:  # inside a call: a new CLOSE ends in this text
            self._parts.append(text)
            window = self._tail + text
            if CLOSE not in window:
                self._tail = window[-(len(CLOSE) - 1) :]
                return "", []
            self._held, self._parts, self._tail = "".join(self._parts), [], ""
        else:
            self._held += text
        content, calls = "", []
        while True:
            start = self._held.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self._held, OPEN)
                content += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep :]
                return content, calls
            end = self._held.find(CLOSE, start)
            if end < 0:
                content += self._held[:start]
                call = self._held[start:]
                self._held, self._parts, self._tail = "", [call], call[-(len(CLOSE) - 1) :]
                return content, calls
            content += self._held[:start]
            body = self._held[start + len(OPEN) : end]
            self._held = self._held[end + len(CLOSE) :]
            call = _call_of(body)
            if call is None:
                content += OPEN + body + CLOSE
            else:
                calls.append(self._numbered(*call))

    def finish(self) -> tuple[str, list[dict]]:
        held = self._held + "".join(self._parts)
        self._held, self._parts, self._tail = "", [], ""
        if self.forced:
            call = _call_of(held)
            return ("", [self._numbered(*call)]) if call else (held, [])
        return held, []

    def _numbered(self, name: str, arguments: Any) -> dict:
        self.calls += 1
        return tool_call(name, arguments, self.calls - 1)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
