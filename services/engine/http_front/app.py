"""The front's routes (Starlette): OpenAI completions, chat and embeddings, models, health, metrics.

POST /v1/chat/completions and /v1/completions: one JSON body, or an SSE stream
of OpenAI chunks ending with `data: [DONE]` (the gateway's chunk shapes,
services/common/openai_api/openai_format.py). The first output is awaited
before answering, so a request the engine refuses gets its status code; a
failure after the stream began is an error event, and the stream ends. A
client that leaves, while it waits for a whole answer, for its first token or
during its stream, cancels its work, and the engine aborts the request.

POST /v1/embeddings: OpenAI's embeddings, parsed and answered as at the
gateway (embedding.py). Each route serves what the engine was started to
serve (--serves): an embed-only engine answers completions and chat with a
400 saying it serves embeddings only, as vLLM's pooling server refuses
generation, and a generate-only one embeddings likewise, before the body is
read.

`model` names this engine's model or a LoRA adapter it has loaded
(completion.py); POST /v1/load_lora_adapter and /v1/unload_lora_adapter load
and unload adapters as vLLM's server does (adapters.py).

GET /v1/models: this engine's model, then each adapter loaded, its `parent`
the model (as vLLM lists them). GET /health: 200 while it takes
requests, 503 draining. GET /metrics: Prometheus text of this process's
registry (maas_engine_* and the model-server protocol's vllm:* series,
model_server_metrics.py), where an endpoint picker looks for them by
default: on the port its InferencePool targets.

Every error is an OpenAI error body (common/openai_api/errors.APIError).
"""

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.embeddings import (
    EmbeddingRequest,
    embedding_list,
    embedding_requests,
)
from maas_services.common.openai_api.errors import CLIENT_CLOSED, APIError, bad_request
from maas_services.common.openai_api.openai_format import Choices, ResponseShape
from maas_services.common.openai_api.parsed_request import chat_request, text_request
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest
from maas_services.common.openai_api.sse import DONE, sse
from maas_services.common.serves import EMBED, GENERATE
from maas_services.engine.http_front import adapters
from maas_services.engine.http_front.bounded_body import parse_body, read_body
from maas_services.engine.http_front.completion import EngineFront
from maas_services.engine.http_front.embedding import embed_all
from maas_services.engine.http_front.http_metrics import CountResponses
from maas_services.engine.http_front.token_gate import TokenGate

log = get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    timeout_seconds: float


# What each kind of work is called in a refusal, and where a client asks for it.
SERVED_AS = {
    GENERATE: "generation (POST /v1/completions, /v1/chat/completions)",
    EMBED: "embeddings (POST /v1/embeddings)",
}


class Routes:
    def __init__(self, front: EngineFront, limits: BodyLimits, serves: list[str]):
        self._front = front
        self._limits = limits
        self._serves = serves  # --serves: "generate", "embed" or both
        self._created = int(time.time())

    def _check_serves(self, kind: str) -> None:
        if kind not in self._serves:
            only = " and ".join(SERVED_AS[served] for served in self._serves)
            raise bad_request(
                f"This model serves {only} only; this engine was started with "
                f"--serves {','.join(self._serves)}.",
                param="model",
            )

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        self._check_serves(GENERATE)
        raw = await self._read(request)
        body = parse_body(ChatCompletionRequest if chat else CompletionRequest, raw)
        del raw  # parsed: the bytes are not held through the answer
        adapter = self._front.check_servable(body.model)
        parsed = chat_request(body, None) if chat else text_request(body, None)
        prompt = await self._front.prompt(parsed)
        shape = ResponseShape.answering(parsed, body, chat, prompt.tool_format)
        deltas = self._front.deltas(parsed, prompt, adapter)
        try:
            # The first output before answering: a refusal still gets its status.
            first = await unless_gone(request, anext(deltas))
        except BaseException:
            await deltas.aclose()
            raise
        if not body.stream:
            return JSONResponse(await unless_gone(request, collect(shape, first, deltas)))
        # Starlette cancels a stream whose client leaves.
        return StreamingResponse(
            events(shape, first, deltas, body.n, body.include_usage),
            media_type="text/event-stream",
        )

    async def embeddings(self, request: Request) -> Response:
        self._check_serves(EMBED)
        raw = await self._read(request)
        body = parse_body(EmbeddingRequest, raw)
        del raw
        adapter = self._front.check_servable(body.model)
        inputs = embedding_requests(body, None)
        model, encoding_format = body.model, body.encoding_format
        del body  # the inputs hold what is left of it
        embedded = await unless_gone(request, embed_all(self._front, inputs, adapter))
        answer = embedding_list(
            model,
            [e.vector for e in embedded],
            sum(e.prompt_tokens for e in embedded),
            encoding_format,
        )
        return Response(answer, media_type="application/json")

    async def models(self, request: Request) -> Response:
        front = self._front
        base = {
            "id": front.model_id,
            "object": "model",
            "created": self._created,
            "owned_by": "maas",
            "max_model_len": front.engine.info.max_model_len,
        }
        loras = [{**base, "id": name, "parent": front.model_id} for name in front.engine.adapters]
        return JSONResponse({"object": "list", "data": [base, *loras]})

    async def load_adapter(self, request: Request) -> Response:
        body = parse_body(adapters.LoadLoraAdapterRequest, await self._read(request))
        return await adapters.load(self._front, body)

    async def unload_adapter(self, request: Request) -> Response:
        body = parse_body(adapters.UnloadLoraAdapterRequest, await self._read(request))
        return await adapters.unload(self._front, body)

    async def _read(self, request: Request) -> bytes:
        return await read_body(request, self._limits.max_bytes, self._limits.timeout_seconds)

    async def health(self, request: Request) -> Response:
        front = self._front
        serving = not front.draining() and front.engine.death is None
        return Response(status_code=200 if serving else 503)

    async def metrics(self, request: Request) -> Response:
        # Off the loop: a scrape walks every collector.
        text = await asyncio.to_thread(generate_latest, REGISTRY)
        return Response(text, media_type=CONTENT_TYPE_LATEST)


class ClientGone(Exception):
    """The client closed the connection before its answer."""


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """work's result; ClientGone if the client leaves first, once the work is
    cancelled and its cleanup done (the engine has been told to abort)."""
    working = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({working, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not working.done():
            working.cancel()
            await asyncio.wait({working})
    if working.cancelled():
        raise ClientGone()
    return working.result()


async def disconnected(request: Request) -> None:
    # The body is read: the server's next message is the client leaving.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(shape: ResponseShape, first: Delta, deltas) -> dict:
    choices, last = Choices(), first
    choices.add(first)
    try:
        async for delta in deltas:
            choices.add(delta)
            last = delta
    finally:
        await deltas.aclose()
    return shape.full(choices, last)


async def events(shape: ResponseShape, first: Delta, deltas, n: int, include_usage: bool):
    last = first
    try:
        if shape.chat:
            for index in range(n):
                yield sse(shape.role_chunk(index, include_usage))
        yield sse(shape.chunk(first, include_usage))
        async for delta in deltas:
            last = delta
            yield sse(shape.chunk(delta, include_usage))
        if include_usage:
            yield sse(shape.usage_chunk(last))
        yield DONE
    except APIError as exc:
        yield sse(exc.body())
    finally:
        await deltas.aclose()


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: APIError) -> Response:
    return _error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    # Unknown paths and wrong methods.
    return _error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


async def _gone(request: Request, exc: ClientGone) -> Response:
    # No one reads it; the status is for the response counter.
    return Response(status_code=CLIENT_CLOSED)


async def _bug(request: Request, exc: Exception) -> Response:
    log.exception("http_front_unhandled_error", path=request.url.path)
    return _error_response(APIError(500, "internal error", type="api_error", code="internal_error"))


def create_app(
    front: EngineFront, limits: BodyLimits, token: str, serves: list[str]
) -> CountResponses:
    routes = Routes(front, limits, serves)
    table = [
        Route("/v1/chat/completions", routes.chat, methods=["POST"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/load_lora_adapter", routes.load_adapter, methods=["POST"]),
        Route("/v1/unload_lora_adapter", routes.unload_adapter, methods=["POST"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=table,
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            ClientGone: _gone,
            Exception: _bug,
        },
    )
    # The token is checked before anything reads the body; every answer is counted.
    return CountResponses(TokenGate(app, token), frozenset(route.path for route in table))
