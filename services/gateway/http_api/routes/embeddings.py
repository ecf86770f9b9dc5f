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
IN_FLIGHT (fewer if its key's max_concurrency is lower), within a window of
prompt tokens (common/openai_api/embeddings.py's each_input, which says why).

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

from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from maas_services.common.openai_api.embeddings import (
    IN_FLIGHT,
    EmbeddingRequest,
    each_input,
    embedding_list,
    embedding_requests,
    returned,
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


async def embed_all(
    pipe: Pipeline, principal: Principal, inputs: list[ParsedRequest]
) -> list[Embedded]:
    """Every input's vector, in input order, or the first failure (module docstring)."""
    leased = bool(principal.tenant.max_concurrency)
    return await each_input(
        inputs,
        principal.tenant.max_concurrency or IN_FLIGHT,
        lambda parsed: embed_one(pipe, principal, parsed, leased),
    )


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
        vector = returned(run.embedding)
    if leased:
        await run.billed()
    return Embedded(vector, len(run.ticket.prompt.token_ids), run.headers)
