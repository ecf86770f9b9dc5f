"""Tools and tool calls in a chat prompt: the template's own format, or the fallback.

A template with a tool format of its own (it reads `tools`, and writes calls
in a format the gateway can read back, services/common/openai_api/tool_parsers) renders
the tools and the history's calls itself, as Hugging Face's
`apply_chat_template(tools=...)` does: it gets the tools and each call as
{"id", "type", "function": {"name", "arguments"}}, arguments decoded from
their JSON text (Qwen2.5's and Llama 3.1's templates write them with tojson).

Any other template (the bundled SmolLM2 one is plain ChatML) gets the
fallback: the tools are described in the system prompt, which asks for each
call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes'
tags, so one parser reads both), and the history's calls are written back in
that form after the message's content; "tool" messages keep their role.

Input messages carry calls as OpenAI does, `tool_calls` with the arguments'
JSON text; `tool_format` names the parser for the answer.
"""

import json
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FALLBACK_FORMAT = "hermes"
# What a template writes around a call -> the parser that reads it. Checked in
# order; "" is a format no parser reads yet (Mistral's), which gets the fallback.
TEMPLATE_FORMATS = (
    ("[TOOL_CALLS]", ""),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": ', "llama3_json"),
)
_READS_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class ChatInput:
    """What the template renders: messages, tools (None: none for it) and the answer's format."""

    messages: list[dict]
    tools: list[dict] | None
    tool_format: str


def template_tool_format(template: str | None) -> str:
    """The call format a template writes itself; "" if it has none the gateway can read."""
    if template is None or not _READS_TOOLS.search(template):
        return ""
    return next((name for marker, name in TEMPLATE_FORMATS if marker in template), "")


def chat_input(template: str | None, messages: list[dict], tools: list[dict] | None) -> ChatInput:
    own = template_tool_format(template)
    if own:
        return ChatInput([_with_decoded_calls(m) for m in messages], tools or None, own)
    written = [_with_written_calls(m) for m in messages]
    if tools:
        _prepend_system(written, system_text(tools))
    return ChatInput(written, None, FALLBACK_FORMAT)


def system_text(tools: list[dict]) -> str:
    listed = "\n".join(json.dumps(tool["function"]) for tool in tools)
    return (
        "You may call these functions:\n"
        f"{listed}\n"
        f"To call one, answer with {OPEN}"
        '{"name": <function name>, "arguments": <arguments as a JSON object>}'
        f"{CLOSE}, one per call, and nothing else."
    )


def written_call(call: dict) -> str:
    # The client's arguments text as it is: it is what the model wrote.
    function = call["function"]
    arguments = function["arguments"] or "{}"
    return f'{OPEN}{{"name": {json.dumps(function["name"])}, "arguments": {arguments}}}{CLOSE}'


def _prepend_system(messages: list[dict], text: str) -> None:
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": f"{text}\n\n{messages[0]['content']}"}
    else:
        messages.insert(0, {"role": "system", "content": text})


def _with_written_calls(message: dict) -> dict:
    calls = message.get("tool_calls")
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if calls:
        out["content"] = "".join([message["content"], *map(written_call, calls)])
    return out


def _with_decoded_calls(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    calls = [
        {**call, "function": {**call["function"], "arguments": _decoded(call)}}
        for call in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _decoded(call: dict):
    text = call["function"]["arguments"]
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text  # not JSON: the template writes it as the string it is
