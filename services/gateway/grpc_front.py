"""maas.v1.Gateway: the tenant gRPC API, over the same Pipeline as HTTP.

Requests are validated by the same pydantic models as the HTTP API, so both
fronts accept and refuse exactly the same things, under the same key, limits
and routing; APIError statuses map onto gRPC codes. The x-ratelimit-* and
Retry-After headers travel as metadata: initial metadata on a served stream,
trailing metadata on a refusal.
"""

import grpc
from pydantic import ValidationError

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from services.gateway.auth import Authenticator
from services.gateway.completions import new_request_id
from services.gateway.errors import APIError
from services.gateway.pipeline import Encoder, Pipeline, RequestSpec, with_headers
from services.gateway.sampling import to_engine_sampling
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

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
}


def options_dict(options: gateway_pb2.CompletionOptions) -> dict:
    fields = {f.name: v for f, v in options.ListFields()}
    fields["stop"] = list(options.stop) or None
    return fields


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, pipeline: Pipeline, auth: Authenticator):
        self._pipeline = pipeline
        self._auth = auth

    async def _principal(self, context):
        metadata = dict(context.invocation_metadata() or ())
        return await self._auth.authenticate(metadata.get("authorization"))

    async def _abort(self, context, error: APIError):
        metadata = tuple((k.lower(), v) for k, v in (error.headers or {}).items())
        await context.abort(
            STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL),
            error.message,
            trailing_metadata=metadata,
        )

    async def ChatCompletion(self, request, context):
        try:
            principal = await self._principal(context)
            body = ChatCompletionRequest(
                model=request.model,
                messages=[{"role": m.role, "content": m.content} for m in request.messages],
                stream=True,
                **options_dict(request.options),
            )
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except APIError as exc:
            await self._abort(context, exc)
        messages = [tokenizer_pb2.ChatMessage(role=m.role, content=m.text()) for m in body.messages]
        service = self._pipeline.service

        async def encode(route, max_tokens):
            return await service.encode_chat(route.tokenizer, messages, max_tokens)

        async for chunk in self._stream(principal, "chatcmpl", body, encode, context):
            yield chunk

    async def Completion(self, request, context):
        try:
            principal = await self._principal(context)
            body = CompletionRequest(
                model=request.model,
                prompt=request.prompt,
                stream=True,
                **options_dict(request.options),
            )
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except APIError as exc:
            await self._abort(context, exc)
        service = self._pipeline.service

        async def encode(route, max_tokens):
            return await service.encode_text(route.tokenizer, body.prompt, max_tokens)

        async for chunk in self._stream(principal, "cmpl", body, encode, context):
            yield chunk

    async def _stream(self, principal, prefix, body: SamplingFields, encode: Encoder, context):
        spec = RequestSpec(
            request_id=new_request_id(prefix),
            model=body.model,
            max_tokens=body.max_tokens,
            n=body.n,
            session_id=body.user or "",
        )
        headers: dict[str, str] = {}
        try:
            sampling = to_engine_sampling(body)
            ticket = await self._pipeline.admit(principal, spec, encode)
            headers = ticket.headers
            deltas = self._pipeline.generate(ticket, sampling)
            first = await anext(deltas)
        except APIError as exc:
            await self._abort(context, with_headers(exc, headers))
        await context.send_initial_metadata(tuple(headers.items()))
        try:
            delta = first
            while True:
                if delta.finish_reason == "error":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the model stopped mid-stream")
                chunk = gateway_pb2.CompletionChunk(
                    id=spec.request_id, model=body.model, text=delta.text
                )
                if delta.finish_reason:
                    chunk.finish_reason = FINISH_CODES.get(delta.finish_reason, 0)
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

    async def ListModels(self, request, context):
        try:
            principal = await self._principal(context)
            models = await self._pipeline.models(principal.tenant)
        except APIError as exc:
            await self._abort(context, exc)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m, owned_by="maas") for m in models]
        )
