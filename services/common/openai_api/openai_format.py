"""OpenAI response and stream-chunk bodies for chat and text completions.

The one chunk model of both fronts: the HTTP front sends these bodies as
they are, the gRPC front copies each chunk's choice into a CompletionChunk
(grpc_front.py), so tool calls are read (tool_parsers/) and screened
(screen_calls) on one path.
"""

import time
from collections import defaultdict
from dataclasses import dataclass, field

from maas.v1 import engine_pb2
from maas_services.common.openai_api.delta import Delta, merged
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.tool_parsers import ToolParser, parser_for


def usage_body(delta: Delta) -> dict:
    return {
        "prompt_tokens": delta.prompt_tokens,
        "completion_tokens": delta.completion_tokens,
        "total_tokens": delta.prompt_tokens + delta.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": delta.cached_prompt_tokens},
    }


def chat_logprobs(logprobs: list[engine_pb2.TokenLogprob]) -> dict:
    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {
                **entry(lp.token, lp.logprob),
                "top_logprobs": [entry(t.token, t.logprob) for t in lp.top_logprobs],
            }
            for lp in logprobs
        ]
    }


def completion_logprobs(logprobs: list[engine_pb2.TokenLogprob], offset: int) -> dict:
    offsets, position = [], offset
    for lp in logprobs:
        offsets.append(position)
        position += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{t.token: t.logprob for t in lp.top_logprobs} for lp in logprobs],
        "text_offset": offsets,
    }


@dataclass
class Choices:
    """Deltas gathered per choice index, for a non-streamed response."""

    # Each choice's text in pieces, joined once: no copy of the text per token.
    parts: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    finish: dict[int, str | None] = field(default_factory=dict)
    logprobs: dict[int, list] = field(default_factory=lambda: defaultdict(list))

    def add(self, delta: Delta) -> None:
        self.parts[delta.index].append(delta.text)
        self.finish[delta.index] = delta.finish_reason
        self.logprobs[delta.index] += delta.logprobs


@dataclass
class ResponseShape:
    """Everything that differs between chat and text completions."""

    request_id: str
    model: str
    chat: bool
    with_logprobs: bool = False
    # Chat with tools: "auto" or "forced" (tool_calls.py), read for calls
    # in the format the prompt asked for (tool_parsers/).
    tool_mode: str = ""
    tool_format: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # Streamed text emitted so far per choice, for the legacy text_offset field.
    _emitted: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    _tool_streams: dict[int, ToolParser] = field(default_factory=dict)

    @classmethod
    def answering(cls, parsed, body, chat: bool, tool_format: str) -> "ResponseShape":
        """The answer's shape for a chat or text completion request: its ParsedRequest,
        its body as the route validated it, and the prompt's tool-call format."""
        return cls(
            parsed.request_id,
            body.model,
            chat=chat,
            with_logprobs=body.top_logprobs_count is not None,
            tool_mode=parsed.tool_mode,
            tool_format=tool_format,
        )

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, logprobs: list, index: int) -> dict | None:
        if not self.with_logprobs:
            return None
        if self.chat:
            return chat_logprobs(logprobs)
        return completion_logprobs(logprobs, self._emitted[index])

    def _choice(self, index: int, body: dict, finish: str | None, logprobs: list) -> dict:
        return {
            "index": index,
            **body,
            "logprobs": self._logprobs(logprobs, index),
            "finish_reason": finish,
        }

    def full(self, choices: Choices, last: Delta) -> dict:
        bodies = []
        for index in sorted(choices.parts):
            text, finish = "".join(choices.parts[index]), choices.finish[index]
            if self.chat and self.tool_mode:
                content, calls = parser_for(self.tool_mode, self.tool_format).whole(text)
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"], finish = calls, "tool_calls"
                body = {"message": message}
            else:
                body = (
                    {"message": {"role": "assistant", "content": text}}
                    if self.chat
                    else {"text": text}
                )
            bodies.append(self._choice(index, body, finish, choices.logprobs[index]))
        return {**self._envelope(self.object, bodies), "usage": usage_body(last)}

    def role_chunk(self, index: int, include_usage: bool) -> dict:
        """Chat streams open each choice with the assistant role and empty content."""
        body = {"delta": {"role": "assistant", "content": ""}}
        return self._chunk_body(self._choice(index, body, None, []), include_usage)

    def chunk(self, delta: Delta, include_usage: bool) -> dict:
        return self._chunk_body(self.chunk_choice(delta), include_usage)

    def ready_together(self, batch: list[Delta], output_filter: OutputFilter) -> list[Delta]:
        """The deltas of a batch ready together as the front writes them: merged
        per choice (delta.merged), but each its own where a blocked tool call
        ends its choice (screen_calls): the choice ends where the call closed,
        and text merged in after the call would pass with it."""
        if self.chat and self.tool_mode and output_filter.ends_choices:
            return batch
        return merged(batch)

    def text_only(self, delta: Delta) -> bool:
        """Whether delta's chunk holds nothing but its text (no finish, logprobs or
        tool calls to read): all such chunks of a choice differ only in the text."""
        return bool(
            delta.text
            and delta.finish_reason is None
            and not self.with_logprobs
            and not (self.chat and self.tool_mode)
        )

    def text_chunk(self, index: int, text: str, include_usage: bool) -> dict:
        """The chunk of a text_only delta of choice `index` (what chunk() makes of it;
        the text offsets chunk() keeps are for logprobs, which text_only excludes)."""
        body = {"delta": {"content": text}} if self.chat else {"text": text}
        return self._chunk_body(self._choice(index, body, None, ()), include_usage)

    def chunk_choice(self, delta: Delta) -> dict:
        """The one choice of delta's chunk, without the chunk's envelope (the gRPC front's)."""
        finish = delta.finish_reason
        if self.chat and self.tool_mode:
            body, finish = self._tool_delta(delta)
        elif self.chat:
            body = {"delta": {"content": delta.text} if delta.text else {}}
        else:
            body = {"text": delta.text}
        choice = self._choice(delta.index, body, finish, delta.logprobs)
        self._emitted[delta.index] += len(delta.text)
        return choice

    def _tool_delta(self, delta: Delta) -> tuple[dict, str | None]:
        """Content outside calls as it comes, each call whole once it closes."""
        if delta.index not in self._tool_streams:
            self._tool_streams[delta.index] = parser_for(self.tool_mode, self.tool_format)
        content, calls, finish = self._tool_streams[delta.index].feed(
            delta.text, delta.finish_reason
        )
        body = {"content": content} if content else {}
        if calls:
            body["tool_calls"] = calls
        return {"delta": body}, finish

    def _chunk_body(self, choice: dict, include_usage: bool) -> dict:
        body = self._envelope(self.chunk_object, [choice])
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, last: Delta) -> dict:
        return {**self._envelope(self.chunk_object, []), "usage": usage_body(last)}


def screen_calls(output_filter: OutputFilter, choice: dict, body: dict) -> bool:
    """Screen the tool calls in a choice's message or delta `body`, in place;
    True when one was blocked, which ends the choice."""
    calls = body.get("tool_calls")
    if not calls:
        return False
    passed, blocked = output_filter.screen_calls(calls)
    if passed:
        body["tool_calls"] = passed
    else:
        del body["tool_calls"]
    if blocked:
        choice["finish_reason"] = "content_filter"
    return blocked
