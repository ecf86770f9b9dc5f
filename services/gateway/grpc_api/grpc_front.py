"""maas.v1.Gateway: the tenant gRPC API, over the same Pipeline as HTTP.

Requests are validated by the same pydantic models as the HTTP API, so both
fronts accept and refuse exactly the same things, under the same key, limits
and routing; APIError statuses map onto gRPC codes. The x-ratelimit-* and
Retry-After headers travel as metadata: initial metadata on a served stream,
trailing metadata on a refusal.

As over HTTP, the key is checked before the message is read. Every method is
registered as request-streaming without a deserializer (add_gateway_to_server;
the wire format of a unary request is the same), so its handler runs on the
call's headers, and grpc reads the message only when the handler asks for it:
until then it holds at most the stream's flow-control window
(grpc_server.PUBLIC_OPTIONS: 64 KiB, BDP probing off). In order, each stage
with its bound:

1. the key, checked within `grpc_message_timeout_seconds`; a call without one
   ends at once, and none holds a slot;
2. a slot: `grpc_max_concurrent_rpcs` calls past their key check at once,
   more get RESOURCE_EXHAUSTED;
3. the message's bytes, reserved in the tenant's byte budget (the one HTTP
   bodies use, body_budget.py) at the receive limit (its size is unknown
   before it is read), then read within `grpc_message_timeout_seconds`, and
   parsed; the budget is given back once the ParsedRequest is built, and
   the raw bytes are dropped with it.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError, Message
from pydantic import ValidationError

from maas.v1 import common_pb2, gateway_pb2
from maas_services.common.chat_messages import message_dict
from maas_services.common.finish_reasons import FINISH_CODES
from maas_services.common.grpc_server import GrpcService, ServerHandle, start_server
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.openai_format import ResponseShape, screen_calls
from maas_services.common.openai_api.parsed_request import (
    ChatPrompt,
    ParsedRequest,
    chat_request,
    text_request,
)
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest
from maas_services.common.ready_batches import told_batches
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.admission.tenants import Principal
from maas_services.gateway.grpc_api.grpc_chat import (
    FieldError,
    call_deltas,
    check_json_fields,
    response_format_dict,
    tool_choice_value,
    tool_dicts,
)
from maas_services.gateway.pipeline import Pipeline, with_headers
from maas_services.gateway.run import Run
from maas_services.gateway.settings import GatewaySettings

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def session_header(context) -> str | None:
    """The same x-session-id the HTTP front reads, from the call's metadata."""
    return dict(context.invocation_metadata() or ()).get("x-session-id")


def options_dict(options: gateway_pb2.CompletionOptions) -> dict:
    fields = {f.name: v for f, v in options.ListFields()}
    fields["stop"] = list(options.stop) or None
    if options.HasField("response_format"):
        fields["response_format"] = response_format_dict(options.response_format)
    return fields


@dataclass(frozen=True)
class FrontLimits:
    slots: int  # calls past their key check at once
    message_bytes: int  # the largest request message
    stage_timeout: float  # for the key check, then for the message


class GatewayServicer:
    """The three RPCs: each call's key, slot and message, then the pipeline."""

    def __init__(
        self, pipeline: Pipeline, auth: Authenticator, budget: BodyBudget, limits: FrontLimits
    ):
        self._pipeline = pipeline
        self._auth = auth
        self._budget = budget
        self._limits = limits
        self.open_calls = 0

    @asynccontextmanager
    async def admitted(self, context) -> AsyncIterator[Principal]:
        """The caller's principal, and a slot for the rest of the call; or the call aborted."""
        metadata = dict(context.invocation_metadata() or ())
        timeout = self._limits.stage_timeout
        try:
            async with asyncio.timeout(timeout):
                principal = await self._auth.authenticate(metadata.get("authorization"))
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the key was not checked within {timeout:g} s"
            )
        except APIError as exc:
            await self._abort(context, exc)
        if self.open_calls >= self._limits.slots:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Concurrent RPC limit exceeded: {self._limits.slots} calls are open",
            )
        self.open_calls += 1
        try:
            yield principal
        finally:
            self.open_calls -= 1

    async def parsed(self, principal: Principal, context, message_type: type[Message], parse):
        """Read the call's message within the tenant's byte budget and the deadline, then
        `parse` it; the budget goes back, and the raw bytes with it, once that is done."""
        lease = self._budget.lease(principal.tenant)
        try:
            try:
                await lease.grow(self._limits.message_bytes)
            except APIError as exc:
                await self._abort(context, exc)
            raw = await self._read(context)
            lease.shrink_to(len(raw))
            try:
                message = message_type.FromString(raw)
            except DecodeError:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request is not a valid {message_type.DESCRIPTOR.full_name}",
                )
            del raw
            return await parse(message, context)
        finally:
            lease.release()

    async def _read(self, context) -> bytes:
        timeout = self._limits.stage_timeout
        try:
            async with asyncio.timeout(timeout):
                raw = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message was not sent within {timeout:g} s",
            )
        if raw is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no message")
        return raw

    async def _abort(self, context, error: APIError):
        metadata = tuple((k.lower(), v) for k, v in (error.headers or {}).items())
        await context.abort(
            STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL),
            error.message,
            trailing_metadata=metadata,
        )

    @staticmethod
    async def chat(request: gateway_pb2.ChatCompletionRequest, context) -> ParsedRequest:
        try:
            check_json_fields(request.tools, request.options)
            body = ChatCompletionRequest(
                model=request.model,
                # Generators: pydantic stops at the schema's max_length instead
                # of first building a dict for every message the caller sent.
                messages=(message_dict(m, lazy_calls=True) for m in request.messages),
                tools=tool_dicts(request.tools) if request.tools else None,
                tool_choice=tool_choice_value(request.tool_choice),
                stream=True,
                **options_dict(request.options),
            )
        except (ValidationError, FieldError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return chat_request(body, session_header(context))

    @staticmethod
    async def completion(request: gateway_pb2.CompletionRequest, context) -> ParsedRequest:
        try:
            check_json_fields((), request.options)
            body = CompletionRequest(
                model=request.model,
                prompt=request.prompt,
                stream=True,
                **options_dict(request.options),
            )
        except (ValidationError, FieldError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return text_request(body, session_header(context))

    @staticmethod
    async def nothing(request: gateway_pb2.ListModelsRequest, context) -> None:
        """ListModels's request has no fields to parse."""

    async def stream(self, principal, parsed: ParsedRequest, context):
        try:
            run = await self._pipeline.admit(principal, parsed)
        except APIError as exc:
            await self._abort(context, exc)
        # Left after the last chunk was handed to grpc, or on any way out.
        async with run:
            async for chunk in self._chunks(parsed, run, context):
                yield chunk

    async def _chunks(self, parsed: ParsedRequest, run: Run, context):
        headers, deltas = run.headers, run.deltas
        try:
            first = await anext(deltas)
        except APIError as exc:
            await self._abort(context, with_headers(exc, headers))
        await context.send_initial_metadata(tuple(headers.items()))
        # The HTTP front's chunk model: tool calls read and screened on its path.
        shape = ResponseShape(
            parsed.request_id,
            parsed.model,
            chat=isinstance(parsed.prompt, ChatPrompt),
            tool_mode=parsed.tool_mode,
            tool_format=run.ticket.prompt.tool_format,
        )
        # As over HTTP (http_stream.py): what is ready together goes in one chunk.
        async with aclosing(told_batches(first, deltas, run.ready)) as batches:
            async for batch in batches:
                for delta in shape.ready_together(batch, self._pipeline.output_filter):
                    if delta.finish_reason == "error":
                        await context.abort(
                            grpc.StatusCode.UNAVAILABLE, "the model stopped mid-stream"
                        )
                    chunk, finished = self._chunk(shape, parsed, delta)
                    yield chunk
                    run.delivered(delta.completion_tokens)
                    if finished:
                        # One choice: it has ended (leaving the run stops the engine).
                        return

    def _chunk(
        self, shape: ResponseShape, parsed: ParsedRequest, delta: Delta
    ) -> tuple[gateway_pb2.CompletionChunk, bool]:
        """The delta's chunk, and whether it ends the choice."""
        if shape.text_only(delta):
            # Most of a stream's chunks: no choice body to build and read back.
            chunk = gateway_pb2.CompletionChunk(
                id=parsed.request_id, model=parsed.model, text=delta.text
            )
            return chunk, False
        choice = shape.chunk_choice(delta)
        body = choice["delta"] if shape.chat else choice
        screen_calls(self._pipeline.output_filter, choice, body)
        finish = choice["finish_reason"]
        chunk = gateway_pb2.CompletionChunk(
            id=parsed.request_id,
            model=parsed.model,
            text=body.get("content", "") if shape.chat else body["text"],
            tool_calls=call_deltas(body.get("tool_calls", [])),
        )
        if finish:
            chunk.finish_reason = FINISH_CODES.get(finish, 0)
            chunk.usage.CopyFrom(
                common_pb2.Usage(
                    prompt_tokens=delta.prompt_tokens,
                    completion_tokens=delta.completion_tokens,
                    cached_prompt_tokens=delta.cached_prompt_tokens,
                )
            )
        return chunk, bool(finish)

    async def list_models(self, principal, context):
        """GET /v1/models' list (Pipeline.models): the same names, adapters with their parent."""
        try:
            models = await self._pipeline.models(principal.tenant)
        except APIError as exc:
            await self._abort(context, exc)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m, owned_by="maas", parent=p) for m, p in models.items()]
        )


Parse = Callable[[Message, grpc.aio.ServicerContext], Awaitable[object]]


def _streaming(servicer: GatewayServicer, message_type: type[Message], parse: Parse):
    async def handle(requests, context) -> AsyncIterator[gateway_pb2.CompletionChunk]:
        async with servicer.admitted(context) as principal:
            parsed = await servicer.parsed(principal, context, message_type, parse)
            async for chunk in servicer.stream(principal, parsed, context):
                yield chunk

    return grpc.stream_stream_rpc_method_handler(
        handle, response_serializer=gateway_pb2.CompletionChunk.SerializeToString
    )


def _list_models(servicer: GatewayServicer):
    async def handle(requests, context) -> gateway_pb2.ListModelsResponse:
        async with servicer.admitted(context) as principal:
            empty = gateway_pb2.ListModelsRequest
            await servicer.parsed(principal, context, empty, servicer.nothing)
            return await servicer.list_models(principal, context)

    return grpc.stream_unary_rpc_method_handler(
        handle, response_serializer=gateway_pb2.ListModelsResponse.SerializeToString
    )


async def start_grpc_front(
    settings: GatewaySettings,
    pipeline: Pipeline,
    auth: Authenticator,
    budget: BodyBudget | None = None,
) -> ServerHandle:
    """Serve the tenant gRPC API on settings.grpc_port, under the limits of a public port.
    `budget` is the HTTP front's, so a tenant's bytes count once across both fronts."""
    budget = budget or BodyBudget(BudgetLimits.from_settings(settings))
    limits = FrontLimits(
        slots=settings.grpc_max_concurrent_rpcs,
        message_bytes=settings.max_body_bytes,
        stage_timeout=settings.grpc_message_timeout_seconds,
    )
    return await start_server(
        "gateway",
        settings.model_copy(update={"port": settings.grpc_port}),
        [
            GrpcService(
                SERVICE_NAME, GatewayServicer(pipeline, auth, budget, limits), add_gateway_to_server
            )
        ],
        # No message larger than an HTTP body; the slots are the servicer's (admitted).
        receive_limit=settings.max_body_bytes,
        # Tenants call here with API keys, never the service token.
        internal=False,
    )


def add_gateway_to_server(servicer: GatewayServicer, server: grpc.aio.Server) -> None:
    """The generated add_GatewayServicer_to_server, but request-streaming and raw (see above)."""
    handlers = {
        "ChatCompletion": _streaming(servicer, gateway_pb2.ChatCompletionRequest, servicer.chat),
        "Completion": _streaming(servicer, gateway_pb2.CompletionRequest, servicer.completion),
        "ListModels": _list_models(servicer),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
