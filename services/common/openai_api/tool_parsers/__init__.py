"""How a model writes its tool calls: one parser per format, by name.

The tokenizer service, which holds the chat template, names the format the
prompt asked for (EncodeResponse.tool_format, from
services/common/chat_tools.py): "hermes" for the fallback and Qwen2.5-style
templates, "llama3_json" for Llama 3.1's. The gateway reads the answer with
that parser, so every backend's output is read the same way. A forced call is
one JSON object whatever the format (the grammar makes it so).
"""

from maas_services.common.openai_api.tool_parsers.base import ToolParser
from maas_services.common.openai_api.tool_parsers.forced import ForcedParser
from maas_services.common.openai_api.tool_parsers.hermes import HermesParser
from maas_services.common.openai_api.tool_parsers.llama3_json import Llama3JsonParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
}
# What a tokenizer that names no format (an older one) rendered: the fallback's.
DEFAULT_FORMAT = "hermes"


def parser_for(tool_mode: str, tool_format: str) -> ToolParser:
    """A fresh parser for one choice; tool_mode is "auto" or "forced" (tool_calls.mode)."""
    if tool_mode == "forced":
        return ForcedParser()
    return PARSERS.get(tool_format or DEFAULT_FORMAT, PARSERS[DEFAULT_FORMAT])()


__all__ = ["PARSERS", "ToolParser", "parser_for"]
