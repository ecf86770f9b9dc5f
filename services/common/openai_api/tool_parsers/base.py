"""The interface every tool-call format's parser implements.

A parser reads one choice's text as it streams: push() returns the content
that is surely not part of a call and the calls that have closed; finish()
what is left at the end. Calls are OpenAI tool_calls numbered from 0 in the
order they close (their `index` in stream deltas). Text that is not a
well-formed call is passed on as content, as the model wrote it.
"""

import json
import uuid
from typing import Any


def tool_call(name: str, arguments: Any, index: int) -> dict:
    """OpenAI's tool call, with its index in the stream (whole answers drop it)."""
    return {
        "index": index,
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def call_of(value: Any, keys: tuple[str, ...] = ("arguments",)) -> tuple[str, Any] | None:
    """(name, arguments) of a decoded {"name", <the first of keys present>} object, else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[key] for key in keys if key in value), {})
    return value["name"], arguments


def decoded_call(text: str) -> tuple[str, Any] | None:
    """call_of the JSON text, None if it is not JSON."""
    try:
        return call_of(json.loads(text))
    except json.JSONDecodeError:
        return None


class ToolParser:
    def __init__(self):
        self.calls = 0

    def push(self, text: str) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def feed(self, text: str, finish_reason: str | None) -> tuple[str, list[dict], str | None]:
        """push, and finish once the finish reason comes: it becomes "tool_calls" if any
        call, unless the output filter ended the choice ("content_filter" stays)."""
        content, calls = self.push(text)
        if finish_reason is None:
            return content, calls, None
        tail, more = self.finish()
        called = self.calls and finish_reason != "content_filter"
        return content + tail, calls + more, "tool_calls" if called else finish_reason

    def whole(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, calls) of a whole output; content None when the answer is only calls."""
        content, calls, _ = self.feed(text, "stop")
        calls = [{k: v for k, v in call.items() if k != "index"} for call in calls]
        return (content or None) if calls else content, calls

    def _numbered(self, name: str, arguments: Any) -> dict:
        self.calls += 1
        return tool_call(name, arguments, self.calls - 1)
