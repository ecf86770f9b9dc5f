"""maas.v1.ChatMessage and RenderChatRequest.tools as dicts, in OpenAI's shape.

Both fronts of the chain read them: the gateway's gRPC front validates the
dicts with the HTTP API's models, the tokenizer renders them (chat_tools.py).
"""

import json

from maas.v1 import tokenizer_pb2
from maas_services.common.chat_template import ChatTemplateError


def message_dict(message: tokenizer_pb2.ChatMessage, lazy_calls: bool = False) -> dict:
    """lazy_calls: tool_calls as a generator, so a validator bounding the list stops early."""
    out = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        calls = (
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        )
        out["tool_calls"] = calls if lazy_calls else list(calls)
    return out


def decoded_tools(text: str) -> list[dict] | None:
    """RenderChatRequest.tools (OpenAI's array as JSON text); None for none."""
    if not text:
        return None
    try:
        tools = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"tools is not JSON: {exc}") from None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools
    ):
        raise ChatTemplateError('tools must be a list of {"type", "function"} objects')
    return tools or None
