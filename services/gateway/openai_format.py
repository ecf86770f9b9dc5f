"""OpenAI response and stream-chunk bodies for chat and text completions."""

import time
from dataclasses import dataclass, field

from services.gateway.completions import Delta


def usage_body(delta: Delta) -> dict:
    return {
        "prompt_tokens": delta.prompt_tokens,
        "completion_tokens": delta.completion_tokens,
        "total_tokens": delta.prompt_tokens + delta.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": delta.cached_prompt_tokens},
    }


@dataclass
class ResponseShape:
    """Everything that differs between chat and text completions."""

    request_id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _choice(self, text: str, finish: str | None, message_key: str) -> dict:
        if self.chat:
            return {"index": 0, message_key: text, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def full(self, text: str, last: Delta) -> dict:
        content = {"role": "assistant", "content": text} if self.chat else text
        choice = self._choice(content, last.finish_reason, "message")
        return {**self._envelope(self.object, [choice]), "usage": usage_body(last)}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def role_chunk(self, include_usage: bool) -> dict:
        """Chat streams open with the assistant role and empty content."""
        return self._chunk_body(
            self._choice({"role": "assistant", "content": ""}, None, "delta"), include_usage
        )

    def chunk(self, delta: Delta, include_usage: bool) -> dict:
        if self.chat:
            content = {"content": delta.text} if delta.text else {}
            choice = self._choice(content, delta.finish_reason, "delta")
        else:
            choice = self._choice(delta.text, delta.finish_reason, "")
        return self._chunk_body(choice, include_usage)

    def _chunk_body(self, choice: dict, include_usage: bool) -> dict:
        body = self._envelope(self.chunk_object, [choice])
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, last: Delta) -> dict:
        return {**self._envelope(self.chunk_object, []), "usage": usage_body(last)}
