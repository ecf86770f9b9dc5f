"""maas.v1.Gateway: the tenant gRPC API, over the same Pipeline as HTTP.

Requests are validated by the same pydantic models as the HTTP API, so both
fronts accept and refuse exactly the same things, under the same key, limits
and routing; APIError statuses map onto gRPC codes. The x-ratelimit-* and
Retry-After headers travel as metadata: initial metadata on a served stream,
trailing metadata on a refusal.

As over HTTP, the key is checked before the body is read: the handlers are
registered without a deserializer (add_gateway_to_server), so an
unauthenticated call costs the raw bytes grpc already holds (bounded by the
server's receive limit) and never the parse, which can take 35 times the wire
size for a message of empty repeated fields.
"""

from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError, Message
from pydantic import ValidationError

from maas.v1 import common_pb2, gateway_pb2
from services.common.chat_messages import message_dict
from services.common.grpc_server import GrpcService, ServerHandle, start_server
from services.gateway.auth import Authenticator
from services.gateway.errors import APIError
from services.gateway.grpc_chat import (
    FieldError,
    call_deltas,
    check_json_fields,
    response_format_dict,
    tool_choice_value,
    tool_dicts,
)
from services.gateway.parsed_request import ParsedRequest, chat_request, text_request
from services.gateway.pipeline import Pipeline, with_headers
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from services.gateway.settings import GatewaySettings
from services.gateway.tenants import Principal
from services.gateway.tool_parsers import parser_for

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
FINISH_CODES = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
    "content_filter": common_pb2.FINISH_REASON_CONTENT_FILTER,
    "tool_calls": common_pb2.FINISH_REASON_TOOL_CALLS,
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


class GatewayServicer:
    """The three RPCs, each called with the caller's principal and its parsed request."""

    def __init__(self, pipeline: Pipeline, auth: Authenticator):
        self._pipeline = pipeline
        self._auth = auth

    async def authenticated(
        self, raw: bytes, message_type: type[Message], context
    ) -> tuple[Principal, Message]:
        """Check the key in the metadata, then parse `raw`; abort the call if either fails."""
        metadata = dict(context.invocation_metadata() or ())
        try:
            principal = await self._auth.authenticate(metadata.get("authorization"))
        except APIError as exc:
            await self._abort(context, exc)
        try:
            return principal, message_type.FromString(raw)
        except DecodeError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request is not a valid {message_type.DESCRIPTOR.full_name}",
            )

    async def _abort(self, context, error: APIError):
        metadata = tuple((k.lower(), v) for k, v in (error.headers or {}).items())
        await context.abort(
            STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL),
            error.message,
            trailing_metadata=metadata,
        )

    async def ChatCompletion(self, principal, request, context):
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
        parsed = chat_request(body, session_header(context))
        async for chunk in self._stream(principal, parsed, context):
            yield chunk

    async def Completion(self, principal, request, context):
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
        parsed = text_request(body, session_header(context))
        async for chunk in self._stream(principal, parsed, context):
            yield chunk

    async def _stream(self, principal, parsed: ParsedRequest, context):
        try:
            completion = await self._pipeline.complete(principal, parsed)
        except APIError as exc:
            await self._abort(context, exc)
        try:
            async for chunk in self._chunks(parsed, completion, context):
                yield chunk
        finally:
            # After the last chunk was handed to grpc, or on any way out.
            completion.delivered()

    async def _chunks(self, parsed: ParsedRequest, completion, context):
        headers, deltas = completion.headers, completion.deltas
        try:
            first = await anext(deltas)
        except APIError as exc:
            await self._abort(context, with_headers(exc, headers))
        await context.send_initial_metadata(tuple(headers.items()))
        # Tools on: the answer is read for calls as it streams, as over HTTP.
        tool_format = completion.ticket.prompt.tool_format
        calls = parser_for(parsed.tool_mode, tool_format) if parsed.tool_mode else None
        try:
            delta = first
            while True:
                if delta.finish_reason == "error":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the model stopped mid-stream")
                text, found, finish = delta.text, [], delta.finish_reason
                if calls is not None:
                    text, found, finish = calls.feed(text, finish)
                chunk = gateway_pb2.CompletionChunk(
                    id=parsed.request_id,
                    model=parsed.model,
                    text=text,
                    tool_calls=call_deltas(found),
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
                yield chunk
                delta = await anext(deltas, None)
                if delta is None:
                    return
        finally:
            await deltas.aclose()

    async def ListModels(self, principal, request, context):
        try:
            models = await self._pipeline.models(principal.tenant)
        except APIError as exc:
            await self._abort(context, exc)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m, owned_by="maas") for m in models]
        )


Handler = Callable[[Principal, Message, grpc.aio.ServicerContext], object]


def _unary_stream(servicer: GatewayServicer, method: Handler, message_type: type[Message]):
    async def handle(raw: bytes, context) -> AsyncIterator[gateway_pb2.CompletionChunk]:
        principal, request = await servicer.authenticated(raw, message_type, context)
        async for chunk in method(principal, request, context):
            yield chunk

    return grpc.unary_stream_rpc_method_handler(
        handle, response_serializer=gateway_pb2.CompletionChunk.SerializeToString
    )


def _unary_unary(servicer: GatewayServicer, method: Handler, message_type: type[Message]):
    async def handle(raw: bytes, context) -> Message:
        principal, request = await servicer.authenticated(raw, message_type, context)
        return await method(principal, request, context)

    return grpc.unary_unary_rpc_method_handler(
        handle, response_serializer=gateway_pb2.ListModelsResponse.SerializeToString
    )


async def start_grpc_front(
    settings: GatewaySettings, pipeline: Pipeline, auth: Authenticator
) -> ServerHandle:
    """Serve the tenant gRPC API on settings.grpc_port, under the limits of a public port."""
    return await start_server(
        "gateway",
        settings.model_copy(update={"port": settings.grpc_port}),
        [GrpcService(SERVICE_NAME, GatewayServicer(pipeline, auth), add_gateway_to_server)],
        # No message larger than an HTTP body, parsed or not, and no more open calls than the cap.
        receive_limit=settings.max_body_bytes,
        max_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
        # Tenants call here with API keys, never the service token.
        internal=False,
    )


def add_gateway_to_server(servicer: GatewayServicer, server: grpc.aio.Server) -> None:
    """The generated add_GatewayServicer_to_server, minus the request deserializers."""
    handlers = {
        "ChatCompletion": _unary_stream(
            servicer, servicer.ChatCompletion, gateway_pb2.ChatCompletionRequest
        ),
        "Completion": _unary_stream(servicer, servicer.Completion, gateway_pb2.CompletionRequest),
        "ListModels": _unary_unary(servicer, servicer.ListModels, gateway_pb2.ListModelsRequest),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
