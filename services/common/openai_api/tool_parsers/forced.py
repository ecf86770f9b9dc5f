"""A forced call (tool_choice "required" or a named function), in any format.

The grammar (tool_calls.forced_call_schema) makes the whole output one JSON
object {"name", "arguments"}, whatever the template's own format, so it is
read once, at the end; held in parts, not joined per token.
"""

from maas_services.common.openai_api.tool_parsers.base import ToolParser, decoded_call


class ForcedParser(ToolParser):
    def __init__(self):
        super().__init__()
        self._parts: list[str] = []

    def push(self, text: str) -> tuple[str, list[dict]]:
        self._parts.append(text)
        return "", []

    def finish(self) -> tuple[str, list[dict]]:
        held, self._parts = "".join(self._parts), []
        call = decoded_call(held)
        return ("", [self._numbered(*call)]) if call else (held, [])
