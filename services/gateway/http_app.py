"""The OpenAI-compatible HTTP API (FastAPI).

POST /v1/chat/completions, POST /v1/completions (streamed as SSE or not),
GET /v1/models, /v1/usage, /healthz and /health (liveness), /readyz.

Nothing here tells an unauthenticated caller more than it must: POST keys are
checked before the body is read (auth_gate.py), /readyz says ready or not
(the reason goes to the log), and /metrics is served on the metrics port
only, which the chart keeps off the public Service.
"""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from maas.v1 import billing_pb2_grpc, tokenizer_pb2
from services.common.logging import get_logger
from services.gateway.auth import Authenticator
from services.gateway.auth_gate import AuthGate
from services.gateway.body_guard import BodyGuard
from services.gateway.completions import Delta, new_request_id
from services.gateway.disconnect import ClientGoneError, unless_disconnected
from services.gateway.errors import APIError
from services.gateway.openai_format import Choices, ResponseShape
from services.gateway.pipeline import Encoder, Pipeline, RequestSpec, with_headers
from services.gateway.sampling import to_engine_sampling
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from services.gateway.tracing_middleware import TracingMiddleware
from services.gateway.usage_api import usage_report

log = get_logger(__name__)

RESPONSES = Counter(
    "maas_gateway_http_responses", "HTTP responses by route and status", ["route", "status"]
)
TYPE_TAGS = {"str", "int", "float", "bool"}
# What nginx logs for a client that closed the connection before the answer.
CLIENT_CLOSED = 499


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def is_field_name(part: str) -> bool:
    """Union members add their type to an error's path ("list[int]", "str",
    "TextPart"); the field names are what the client needs."""
    return part.isidentifier() and not part[0].isupper() and part not in TYPE_TAGS


def validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request.", param=None)
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(p for p in loc if p.isdigit() or is_field_name(p))
    message = first.get("msg", "invalid value")
    return APIError(400, f"Invalid value for '{param}': {message}", param=param or None)


def not_ready(reason: str) -> JSONResponse:
    # Anyone can call the probe: the reason (Redis or gRPC errors, hosts) is for the log.
    log.warning("not_ready", reason=reason)
    return JSONResponse({"status": "not ready"}, status_code=503)


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


@dataclass
class Gateway:
    """What the HTTP routes need."""

    pipeline: Pipeline
    auth: Authenticator
    redis: Redis
    max_body_bytes: int
    billing: billing_pb2_grpc.BillingStub | None = None
    body_timeout_seconds: float = 30.0


def create_app(gw: Gateway) -> FastAPI:
    app = FastAPI(title="maas gateway", docs_url=None, redoc_url=None)
    app.add_middleware(BodyGuard, max_bytes=gw.max_body_bytes, read_timeout=gw.body_timeout_seconds)
    # Outside BodyGuard: the key is checked before the body is read.
    app.add_middleware(AuthGate, auth=gw.auth)
    # Added last, so outermost: the span and the timings cover every byte.
    app.add_middleware(TracingMiddleware)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        RESPONSES.labels(request.url.path, exc.status).inc()
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        RESPONSES.labels(request.url.path, 400).inc()
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        # Unknown paths, wrong methods and bodies FastAPI could not read.
        RESPONSES.labels("other", exc.status_code).inc()
        return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        # A bug of ours; the client still gets an OpenAI error body.
        log.exception("unhandled_error", path=request.url.path)
        RESPONSES.labels(request.url.path, 500).inc()
        return error_response(
            APIError(500, "internal error", type="api_error", code="internal_error")
        )

    @app.get("/healthz")
    @app.get("/health")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        try:
            await gw.redis.ping()
            models = await gw.pipeline.models()
        except (RedisError, APIError, grpc.aio.AioRpcError) as exc:
            return not_ready(str(exc))
        if not models:
            return not_ready("no models")
        return {"status": "ready"}

    @app.get("/v1/models")
    async def list_models(request: Request):
        principal = await gw.auth.authenticate(request.headers.get("authorization"))
        models = await gw.pipeline.models(principal.tenant)
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "maas"} for m in models
            ],
        }

    @app.get("/v1/usage")
    async def usage(
        request: Request,
        start: str | None = None,
        end: str | None = None,
        granularity: str | None = None,
    ):
        principal = await gw.auth.authenticate(request.headers.get("authorization"))
        return await usage_report(gw.billing, principal.tenant.name, start, end, granularity)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        messages = [
            tokenizer_pb2.ChatMessage(role=m.role, content=m.text(), name=m.name or "")
            for m in body.messages
        ]

        async def encode(route, max_tokens):
            return await gw.pipeline.service.encode_chat(route.tokenizer, messages, max_tokens)

        return await serve(gw, request, body, encode, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt = (
            body.prompt[0]
            if isinstance(body.prompt, list) and isinstance(body.prompt[0], str)
            else body.prompt
        )

        async def encode(route, max_tokens):
            return await gw.pipeline.service.encode_text(route.tokenizer, prompt, max_tokens)

        return await serve(gw, request, body, encode, chat=False)

    return app


async def serve(
    gw: Gateway, request: Request, body: SamplingFields, encode: Encoder, chat: bool
) -> Response:
    principal = request.state.principal
    spec = RequestSpec(
        request_id=new_request_id("chatcmpl" if chat else "cmpl"),
        model=body.model,
        max_tokens=body.max_tokens,
        n=body.n,
        session_id=request.headers.get("x-session-id") or body.user or "",
    )
    sampling = to_engine_sampling(body)
    ticket = await gw.pipeline.admit(principal, spec, encode)
    shape = ResponseShape(
        spec.request_id, body.model, chat=chat, with_logprobs=body.top_logprobs_count is not None
    )
    deltas = gw.pipeline.generate(ticket, sampling)
    headers = {"x-request-id": spec.request_id, **ticket.headers}
    try:
        return await respond(request, shape, body, deltas, headers)
    except APIError as exc:
        raise with_headers(exc, headers) from None


STREAM_BROKEN = APIError(
    502, "the model stopped responding mid-stream", type="api_error", code="upstream_error"
)


async def prepend(first: Delta, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    yield first
    async for delta in rest:
        yield delta


async def collect(shape: ResponseShape, first: Delta, deltas: AsyncIterator[Delta]) -> dict:
    choices, last = Choices(), first
    try:
        async for delta in prepend(first, deltas):
            if delta.finish_reason == "error":
                raise STREAM_BROKEN
            choices.add(delta)
            last = delta
    finally:
        await deltas.aclose()
    return shape.full(choices, last)


async def respond(
    request: Request,
    shape: ResponseShape,
    body: SamplingFields,
    deltas: AsyncIterator[Delta],
    headers: dict[str, str],
) -> Response:
    route = request.url.path
    try:
        # Pull the first delta before answering, so failures before any token
        # (no capacity, bad prompt ids) still get a proper status code.
        first = await unless_disconnected(request.receive, anext(deltas))
        if not body.stream:
            full = await unless_disconnected(request.receive, collect(shape, first, deltas))
            RESPONSES.labels(route, 200).inc()
            return JSONResponse(full, headers=headers)
    except ClientGoneError:
        await deltas.aclose()
        RESPONSES.labels(route, CLIENT_CLOSED).inc()
        return Response(status_code=CLIENT_CLOSED)

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
