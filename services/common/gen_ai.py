"""OpenTelemetry's GenAI semantic conventions: the attributes of a generation span.

The gateway's request span and the engine's Generate span both describe one
generation, so a tracing backend that knows the conventions (model, token
usage, finish reasons) reads either without knowing maas. The names are the
conventions' current ones (`gen_ai.usage.input_tokens`, not the retired
`prompt_tokens`).
"""

CHAT = "chat"
TEXT_COMPLETION = "text_completion"
EMBEDDINGS = "embeddings"


def request_attributes(
    operation: str, model: str, max_tokens: int, temperature: float
) -> dict[str, str | int | float]:
    """What was asked for: set when the generation starts."""
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.temperature": temperature,
    }


def response_attributes(
    model: str, input_tokens: int, output_tokens: int, finish_reasons: dict[int, str]
) -> dict[str, str | int | list[str]]:
    """What came back: `finish_reasons` by choice index, listed in index order."""
    return {
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.response.finish_reasons": [finish_reasons[i] for i in sorted(finish_reasons)],
    }
