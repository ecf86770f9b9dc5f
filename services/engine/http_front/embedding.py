"""One OpenAI embeddings request through this engine: each input's vector, in input order.

Parsed and answered by the gateway's code (common/openai_api/embeddings.py),
each input a request of its own in the engine, as the gateway sends them over
gRPC: its text encoded and checked as a completion's prompt is (EngineFront's
prompt), its sampling the embedding the servicer runs (EngineFront's outputs:
a prefill with no decode, one output holding the vector). A list goes through
each_input, as at the gateway: at most IN_FLIGHT inputs and a window of
prompt tokens in the engine at once, so a list of 2048 waits for its places a
few at a time instead of filling the engine's queue ahead of other callers'
requests. The first input refused is the answer, naming the field
(`input[i]` or `dimensions`).
"""

from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass

from maas_services.common.openai_api.embeddings import IN_FLIGHT, each_input
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.engine.http_front.completion import EngineFront


@dataclass(frozen=True)
class Embedded:
    vector: Sequence[float]
    prompt_tokens: int


async def embed_all(
    front: EngineFront, inputs: list[ParsedRequest], adapter: str
) -> list[Embedded]:
    """Every input's vector (with adapter, if named), in input order, or the first failure
    (module docstring)."""
    return await each_input(inputs, IN_FLIGHT, lambda parsed: embed_one(front, parsed, adapter))


async def embed_one(front: EngineFront, parsed: ParsedRequest, adapter: str) -> Embedded:
    prompt = await front.prompt(parsed)
    # An embedding is answered by one output, at the end of its prefill.
    async with aclosing(front.outputs(parsed, prompt, adapter)) as outputs:
        async for output in outputs:
            last = output
    return Embedded(last.embedding, last.prompt_tokens)
