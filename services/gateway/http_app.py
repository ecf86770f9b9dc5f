"""The OpenAI-compatible HTTP API (FastAPI).

POST /v1/chat/completions, POST /v1/completions (streamed as SSE or not),
GET /v1/models, /healthz and /health (liveness), /readyz, /metrics.
"""

import json
from collections.abc import AsyncIterator

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from maas.v1 import tokenizer_pb2
from services.gateway.auth import authenticate
from services.gateway.completions import CompletionService, Delta, new_request_id
from services.gateway.errors import APIError
from services.gateway.openai_format import Choices, ResponseShape
from services.gateway.sampling import to_engine_sampling
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from services.gateway.tenants import TenantStore

RESPONSES = Counter(
    "maas_gateway_http_responses", "HTTP responses by route and status", ["route", "status"]
)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request.", param=None)
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    # Union members add their type name to the path; the field is what matters.
    param = ".".join(p for p in loc if not p[:1].isupper() and p not in ("str", "list[int]"))
    message = first.get("msg", "invalid value")
    return APIError(400, f"Invalid value for '{param}': {message}", param=param or None)


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


def create_app(service: CompletionService, store: TenantStore, redis: Redis) -> FastAPI:
    app = FastAPI(title="maas gateway", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        RESPONSES.labels(request.url.path, exc.status).inc()
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        RESPONSES.labels(request.url.path, 400).inc()
        return error_response(validation_error(exc))

    @app.get("/healthz")
    @app.get("/health")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        try:
            await redis.ping()
            models = await service.list_models()
        except (RedisError, APIError, grpc.aio.AioRpcError) as exc:
            return JSONResponse({"status": "not ready", "reason": str(exc)}, status_code=503)
        if not models:
            return JSONResponse({"status": "not ready", "reason": "no models"}, status_code=503)
        return {"status": "ready", "models": models}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request):
        await authenticate(store, request.headers.get("authorization"))
        models = await service.list_models()
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "maas"} for m in models
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        principal = await authenticate(store, request.headers.get("authorization"))
        messages = [
            tokenizer_pb2.ChatMessage(role=m.role, content=m.text(), name=m.name or "")
            for m in body.messages
        ]
        prompt_ids = await service.prepare_chat(body.model, messages, body.max_tokens)
        shape = ResponseShape(
            new_request_id("chatcmpl"), body.model, chat=True,
            with_logprobs=body.top_logprobs_count is not None,
        )
        deltas = service.generate(
            principal,
            shape.request_id,
            body.model,
            prompt_ids,
            to_engine_sampling(body),
            session_id=request.headers.get("x-session-id") or body.user or "",
        )
        return await respond(shape, body, deltas, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        principal = await authenticate(store, request.headers.get("authorization"))
        prompt = (
            body.prompt[0]
            if isinstance(body.prompt, list) and isinstance(body.prompt[0], str)
            else body.prompt
        )
        prompt_ids = await service.prepare_text(body.model, prompt, body.max_tokens)
        shape = ResponseShape(
            new_request_id("cmpl"), body.model, chat=False,
            with_logprobs=body.top_logprobs_count is not None,
        )
        deltas = service.generate(
            principal,
            shape.request_id,
            body.model,
            prompt_ids,
            to_engine_sampling(body),
            session_id=request.headers.get("x-session-id") or body.user or "",
        )
        return await respond(shape, body, deltas, "/v1/completions")

    return app


STREAM_BROKEN = APIError(
    502, "the model stopped responding mid-stream", type="api_error", code="upstream_error"
)


async def prepend(first: Delta, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    yield first
    async for delta in rest:
        yield delta


async def respond(
    shape: ResponseShape, body: SamplingFields, deltas: AsyncIterator[Delta], route: str
) -> Response:
    # Pull the first delta before answering, so failures before any token
    # (no capacity, bad prompt ids) still get a proper status code.
    first = await anext(deltas)
    headers = {"x-request-id": shape.request_id}
    if not body.stream:
        choices, last = Choices(), first
        try:
            async for delta in prepend(first, deltas):
                if delta.finish_reason == "error":
                    raise STREAM_BROKEN
                choices.add(delta)
                last = delta
        finally:
            await deltas.aclose()
        RESPONSES.labels(route, 200).inc()
        return JSONResponse(shape.full(choices, last), headers=headers)

    async def events():
        last = first
        try:
            if shape.chat:
                for index in range(body.n):
                    yield sse(shape.role_chunk(index, body.include_usage))
            async for delta in prepend(first, deltas):
                last = delta
                if delta.finish_reason == "error":
                    yield sse(STREAM_BROKEN.body())
                    return
                yield sse(shape.chunk(delta, body.include_usage))
        finally:
            await deltas.aclose()
        if body.include_usage:
            yield sse(shape.usage_chunk(last))
        yield sse("[DONE]")

    RESPONSES.labels(route, 200).inc()
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
