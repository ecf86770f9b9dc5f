"""POST /v1/embeddings: OpenAI's embeddings API (common/openai_api/embeddings.py).

Each input is a request of its own, through the same admission as every
completion (pipeline.py: the key's caps, RPM, quota, the model's route, the
tokenizer's context check, a TPM reservation of its prompt only, a place in
the deployment's fair queue) and its own Run, billed as input tokens (a usage
event with no completion tokens). One request per input, rather than one for
the list, because that is what the engine and the fair queue schedule: a
list of 2048 inputs waits for its places one input at a time beside other
tenants' requests instead of taking 2048 slots at once, and each input is
refused, settled and billed by the code every request already goes through.

One client request holds few inputs in the engines at once: at most
IN_FLIGHT (fewer if its key's max_concurrency is lower), and while more than
one is in flight, at most TOKENS_IN_FLIGHT prompt tokens (TokenWindow). An
engine step computes up to 2048 prompt tokens beside its decodes, so another
tenant's stream pays for every token of the list in the step it shares.
Measured on the real stack (docs/embeddings.md): with eight 300-token inputs
in flight another tenant's chat request (0.3 s alone) took 16.6 s, with the
window (two) at most 4.3 s, for the same embedding throughput; short inputs
still go eight at a time, 2.6x the inputs per second of two.

A key with a max_concurrency has each slot wait for its input's bill (which
ends the input's concurrency lease, run.Run.billed) before admitting the
next, so a request is never refused for its own leases. Each input counts as
one request against the key's RPM (the limiter counts every admission; there
is no lease without a count), so a list longer than the key's RPM is refused
at once, before any input is admitted, rather than part-way.

The answer is all or nothing: the first input refused or failed stops the
others (each billed for what its engine computed, as any request cut short)
and is the request's answer, naming the input by its index.
"""

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from maas_services.common.defaults import MAX_NUM_BATCHED_TOKENS
from maas_services.common.openai_api.embeddings import (
    EmbeddingRequest,
    embedding_list,
    embedding_requests,
)
from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.gateway.admission.tenants import Principal
from maas_services.gateway.http_api.disconnect import ClientGoneError, cancelled_if_gone
from maas_services.gateway.http_api.http_metrics import RESPONSES
from maas_services.gateway.http_api.http_stream import gone
from maas_services.gateway.http_api.routes.deps import PipelineDep, release_body
from maas_services.gateway.pipeline import Pipeline, with_headers

router = APIRouter()

ROUTE = "/v1/embeddings"
# Inputs of one request in flight at once, at most (module docstring).
IN_FLIGHT = 8
# Prompt tokens of one request in flight at once once it has more than one:
# half an engine step's default budget.
TOKENS_IN_FLIGHT = MAX_NUM_BATCHED_TOKENS // 2
# English runs about four characters a token; the window needs no more than a
# guess before the tokenizer has counted.
CHARS_PER_TOKEN = 4


@dataclass
class Embedded:
    vector: Sequence[float]
    prompt_tokens: int
    headers: dict[str, str]


@router.post(ROUTE)
async def create_embeddings(
    body: EmbeddingRequest, request: Request, pipe: PipelineDep
) -> Response:
    principal = request.state.principal
    inputs = embedding_requests(body, request.headers.get("x-session-id"))
    encoding_format = body.encoding_format
    del body
    release_body(request)
    rpm = principal.tenant.rpm
    if rpm and len(inputs) > rpm:
        raise bad_request(
            f"input has {len(inputs)} items, and each counts as one request against "
            f"this key's limit of {rpm} requests per minute.",
            param="input",
        )
    try:
        # A client gone stops every input: queued ones give their places up,
        # running ones are aborted (run.py).
        with cancelled_if_gone(request.scope):
            embedded = await embed_all(pipe, principal, inputs)
    except ClientGoneError:
        return gone(ROUTE)
    answer = embedding_list(
        inputs[0].model,
        [e.vector for e in embedded],
        sum(e.prompt_tokens for e in embedded),
        encoding_format,
    )
    RESPONSES.labels(ROUTE, 200).inc()
    # The last input's rate-limit headers are the latest counts.
    return Response(answer, media_type="application/json", headers=embedded[-1].headers)


class TokenWindow:
    """Prompt tokens in flight: an input waits while others hold `budget`; one
    alone always goes, however long."""

    def __init__(self, budget: int):
        self._budget = budget
        self._used = 0
        self._changed = asyncio.Condition()

    async def take(self, tokens: int) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self._used or self._used + tokens <= self._budget
            )
            self._used += tokens

    async def give(self, tokens: int) -> None:
        async with self._changed:
            self._used -= tokens
            self._changed.notify_all()


def guessed_tokens(parsed: ParsedRequest) -> int:
    text = parsed.prompt.text
    return len(text) if isinstance(text, list) else -(-len(text) // CHARS_PER_TOKEN)


async def embed_all(
    pipe: Pipeline, principal: Principal, inputs: list[ParsedRequest]
) -> list[Embedded]:
    """Every input's vector, in input order, or the first failure (module docstring)."""
    results: list[Embedded | None] = [None] * len(inputs)
    todo = iter(enumerate(inputs))
    window = TokenWindow(TOKENS_IN_FLIGHT)
    leased = bool(principal.tenant.max_concurrency)

    async def slot() -> None:
        for index, parsed in todo:
            tokens = guessed_tokens(parsed)
            await window.take(tokens)
            try:
                results[index] = await embed_one(pipe, principal, parsed, leased)
            except APIError as exc:
                raise named(exc, index, len(inputs)) from None
            finally:
                await window.give(tokens)

    width = min(principal.tenant.max_concurrency or IN_FLIGHT, IN_FLIGHT, len(inputs))
    slots = [asyncio.create_task(slot()) for _ in range(width)]
    try:
        await asyncio.gather(*slots)
    finally:
        for task in slots:
            task.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
    return results


async def embed_one(
    pipe: Pipeline, principal: Principal, parsed: ParsedRequest, leased: bool
) -> Embedded:
    """One input through admission and its engine; with `leased`, until its
    concurrency lease has ended too."""
    run = await pipe.admit(principal, parsed)
    async with run:
        try:
            async for _ in run.deltas:
                pass
        except APIError as exc:
            raise with_headers(exc, run.headers) from None
        vector = run.embedding
        if not vector:
            raise APIError(
                502, "the model returned no embedding", type="api_error", code="upstream_error"
            )
    if leased:
        await run.billed()
    return Embedded(vector, len(run.ticket.prompt.token_ids), run.headers)


def named(error: APIError, index: int, count: int) -> APIError:
    """The field a refusal is about: the tokenizer names the prompt (a text over
    the model's context), the engine nothing (its refusals of `dimensions`
    above the model's size say so); the client sent `input`."""
    if error.status == 400 and error.param in (None, "prompt"):
        error.param = "dimensions" if "dimensions" in error.message else "input"
        if count > 1 and error.param == "input":
            error.message = f"input[{index}]: {error.message}"
    return error
