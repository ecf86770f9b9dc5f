"""Shapes the OpenAI API reference gives, checked where several checks meet them."""

import httpx

from maas_tools.conformance.result import expect
from maas_tools.conformance.target import json_body

# chat.completion(.chunk) choices[].finish_reason.
FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# A prompt a small model continues past any small max_tokens (finish_reason "length").
LONG_ANSWER = ask("Count from 1 to 200, separated by commas.")


def usage_shape(usage: object, where: str) -> dict:
    expect(isinstance(usage, dict), f"{where}: usage is an object, got {usage!r}")
    counts = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    for name, value in counts.items():
        expect(
            isinstance(value, int) and value >= 0,
            f"{where}: usage.{name} is a whole number, got {value!r}",
        )
    expect(
        counts["total_tokens"] == counts["prompt_tokens"] + counts["completion_tokens"],
        f"{where}: usage.total_tokens {counts['total_tokens']} != prompt_tokens + "
        f"completion_tokens ({counts['prompt_tokens']} + {counts['completion_tokens']})",
    )
    return counts


def chunk_envelope(chunk: dict, first: dict) -> None:
    """A chat.completion.chunk's fields, the same id/model/created on every chunk."""
    expect(
        chunk.get("object") == "chat.completion.chunk",
        f"chunk object is 'chat.completion.chunk', got {chunk.get('object')!r}",
    )
    expect(isinstance(chunk.get("id"), str) and chunk["id"], "chunk id is a non-empty string")
    expect(isinstance(chunk.get("created"), int), "chunk created is a Unix time (integer)")
    expect(isinstance(chunk.get("model"), str), "chunk model is a string")
    expect(chunk["id"] == first["id"], "every chunk of a stream has the same id")
    expect(isinstance(chunk.get("choices"), list), "chunk choices is a list")
    for choice in chunk["choices"]:
        expect(isinstance(choice.get("index"), int), "every streamed choice has an integer index")
        expect(isinstance(choice.get("delta"), dict), "every streamed choice has a delta object")
        reason = choice.get("finish_reason")
        expect(
            reason is None or reason in FINISH_REASONS,
            f"finish_reason is null or one of {sorted(FINISH_REASONS)}, got {reason!r}",
        )


def streamed_text(chunks: list[dict], index: int = 0) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for chunk in chunks
        for c in chunk["choices"]
        if c["index"] == index
    )


def finishes(chunks: list[dict]) -> dict[int, list[str]]:
    """index -> the finish_reasons its chunks carried."""
    seen: dict[int, list[str]] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            if c.get("finish_reason") is not None:
                seen.setdefault(c["index"], []).append(c["finish_reason"])
    return seen


def envelope(reply: httpx.Response, what: str) -> dict:
    body = json_body(reply)
    error = body.get("error")
    expect(isinstance(error, dict), f"{what}: body is {{'error': {{...}}}}, got {body!r:.160}")
    missing = [k for k in ("message", "type", "param", "code") if k not in error]
    expect(not missing, f"{what}: the error object lacks {missing}: {error!r:.160}")
    expect(
        isinstance(error["message"], str) and error["message"],
        f"{what}: error.message is a non-empty string",
    )
    expect(isinstance(error["type"], str), f"{what}: error.type is a string, got {error['type']!r}")
    for key in ("param", "code"):
        expect(
            error[key] is None or isinstance(error[key], str),
            f"{what}: error.{key} is a string or null, got {error[key]!r}",
        )
    return error
