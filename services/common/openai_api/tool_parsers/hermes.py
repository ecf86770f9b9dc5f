"""Hermes-style calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The format of Qwen2.5's and Hermes' templates, and the one the fallback asks
for (services/common/chat_tools.py) when a template has no tool format of its
own. Any number of calls, with content before, between and after them.
"""

from maas_services.common.openai_api.tool_parsers.base import ToolParser, decoded_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    """Text that may be the start of OPEN is held back until it is clear."""

    def __init__(self):
        super().__init__()
        self._held = ""
        # Per token, no copy of what is held: a call not yet closed is kept in
        # parts and joined once; only the end of its parts (_tail) is searched
        # for CLOSE as each token comes.
        self._parts: list[str] = []
        self._tail = ""

    def push(self, text: str) -> tuple[str, list[dict]]:
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
            call = decoded_call(body)
            if call is None:
                content += OPEN + body + CLOSE
            else:
                calls.append(self._numbered(*call))

    def finish(self) -> tuple[str, list[dict]]:
        held = self._held + "".join(self._parts)
        self._held, self._parts, self._tail = "", [], ""
        return held, []


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
