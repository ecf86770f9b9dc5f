"""The engine's deltas -> a Response's output items and its typed stream events.

One renderer for both answers, so a streamed response is the sum of its
events and equals the one returned whole: `feed` takes each delta and
returns the events it caused (a non-streamed answer drops them), `finish`
closes what is open, and `response()` is the Response object at any point.

The event sequence is OpenAI's (the openai SDK's types/responses/*_event.py),
each event with its `sequence_number`:
response.created, response.in_progress; per message item
response.output_item.added, response.content_part.added,
response.output_text.delta..., response.output_text.done,
response.content_part.done, response.output_item.done; per function call
response.output_item.added, response.function_call_arguments.delta,
response.function_call_arguments.done, response.output_item.done; then
response.completed, or response.incomplete (the token limit, the output
filter), or response.failed (the engine broke off).

Tool calls are read from the text by the chat route's parsers
(output/tool_parsers/) and screened by the output filter, as chat's are: a
call is complete when it is read, so its arguments come in one delta. Text
around calls stays in message items, in the order the model wrote it.
"""

import time
import uuid
from dataclasses import dataclass, field

from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.tool_parsers import ToolParser, parser_for
from maas_services.gateway.responses.request import ResponsesRequest

# A finish reason -> why the response is incomplete (None: it is complete).
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class ResponseRender:
    response_id: str
    body: ResponsesRequest
    output_filter: OutputFilter
    tool_mode: str = ""
    tool_format: str = ""
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: list[dict] = field(default_factory=list)
    status: str = "in_progress"
    finish_reason: str | None = None
    # As asked until the store has answered; as done after (Keeper in the route).
    store: bool = False
    _sequence: int = 0
    _parser: ToolParser | None = None
    # The open message item and its text so far, in pieces.
    _message: dict | None = None
    _parts: list[str] = field(default_factory=list)
    _last: Delta | None = None

    def __post_init__(self) -> None:
        if self.tool_mode:
            self._parser = parser_for(self.tool_mode, self.tool_format)

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def start(self) -> list[dict]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def feed(self, delta: Delta) -> list[dict]:
        """The events of one delta; once a delta carries a finish reason, the
        items are closed (`ended`), and end() gives the last event."""
        self._last = delta
        finish = delta.finish_reason
        if finish == "error":
            # The engine broke off: end() says response.failed.
            self.status = "failed"
            return []
        if self._parser is None:
            content, calls = delta.text, []
        else:
            content, calls, finish = self._parser.feed(delta.text, finish)
        events = self._text(content) if content else []
        if calls:
            passed, blocked = self.output_filter.screen_calls(calls)
            events += self._calls(passed)
            if blocked:
                finish = "content_filter"
        if finish:
            events += self._finish(finish)
        return events

    def _text(self, text: str) -> list[dict]:
        events = []
        if self._message is None:
            events = self._open_message()
        self._parts.append(text)
        return events + [
            self._event(
                "response.output_text.delta",
                item_id=self._message["id"],
                output_index=len(self.output) - 1,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        ]

    def _open_message(self) -> list[dict]:
        self._message = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self.output.append(self._message)
        index = len(self.output) - 1
        return [
            self._event("response.output_item.added", output_index=index, item=dict(self._message)),
            self._event(
                "response.content_part.added",
                item_id=self._message["id"],
                output_index=index,
                content_index=0,
                part=text_part(""),
            ),
        ]

    def _close_message(self, status: str) -> list[dict]:
        message, index = self._message, len(self.output) - 1
        if message is None:
            return []
        text = "".join(self._parts)
        self._message, self._parts = None, []
        message["content"] = [text_part(text)]
        message["status"] = status
        where = {"item_id": message["id"], "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=text_part(text)),
            self._event("response.output_item.done", output_index=index, item=message),
        ]

    def _calls(self, calls: list[dict]) -> list[dict]:
        events = self._close_message("completed")
        for call in calls:
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
            self.output.append(item)
            index = len(self.output) - 1
            where = {"item_id": item["id"], "output_index": index}
            events += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                ),
                self._event(
                    "response.function_call_arguments.delta", **where, delta=item["arguments"]
                ),
                self._event(
                    "response.function_call_arguments.done", **where, arguments=item["arguments"]
                ),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        return events

    def _finish(self, finish: str) -> list[dict]:
        self.finish_reason = finish
        reason = INCOMPLETE.get(finish)
        # A response with nothing to say still says it: one empty message.
        events = self._open_message() if not self.output else []
        events += self._close_message("incomplete" if reason else "completed")
        self.status = "incomplete" if reason else "completed"
        return events

    def end(self) -> dict:
        """The last event: the response as it ended (after `store` is known); a
        response whose deltas stopped before a finish reason has failed."""
        if not self.ended:
            self.status = "failed"
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
        return self._event(kind.get(self.status, "response.failed"), response=self.response())

    @property
    def ended(self) -> bool:
        return self.status != "in_progress"

    def text(self) -> str:
        """Every message item's text, in order."""
        return "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )

    def calls(self) -> list[dict]:
        return [item for item in self.output if item["type"] == "function_call"]

    def response(self) -> dict:
        body, reason = self.body, INCOMPLETE.get(self.finish_reason or "")
        fmt = body.text.format if body.text and body.text.format else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": (
                {"code": "server_error", "message": "the model stopped responding mid-stream"}
                if self.status == "failed"
                else None
            ),
            "incomplete_details": {"reason": reason} if self.status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": body.model,
            "output": self.output,
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": None,
            "store": self.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {
                "format": fmt.model_dump(by_alias=True, exclude_none=True)
                if fmt
                else {"type": "text"}
            },
            "tool_choice": self._tool_choice(),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": "disabled",
            "usage": self._usage(),
            "user": body.user,
        }

    def _tool_choice(self):
        choice = self.body.tool_choice
        if choice is None:
            return "auto"
        return choice if isinstance(choice, str) else choice.model_dump()

    def _usage(self) -> dict | None:
        last = self._last
        if last is None or not self.ended:
            return None
        return {
            "input_tokens": last.prompt_tokens,
            # No explicit prompt caching here: nothing is written on request.
            "input_tokens_details": {
                "cached_tokens": last.cached_prompt_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": last.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": last.prompt_tokens + last.completion_tokens,
        }
