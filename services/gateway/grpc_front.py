"""maas.v1.Gateway: the tenant gRPC API, over the same CompletionService.

Requests are validated by the same pydantic models as the HTTP API, so both
fronts accept and refuse exactly the same things; APIError statuses map onto
gRPC codes.
"""

import grpc
from pydantic import ValidationError

from maas.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2
from services.gateway.auth import authenticate
from services.gateway.completions import CompletionService, new_request_id
from services.gateway.errors import APIError
from services.gateway.sampling import to_engine_sampling
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from services.gateway.tenants import TenantStore

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
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
    def __init__(self, service: CompletionService, store: TenantStore):
        self._service = service
        self._store = store

    async def _principal(self, context):
        metadata = dict(context.invocation_metadata() or ())
        return await authenticate(self._store, metadata.get("authorization"))

    async def _abort(self, context, error: APIError):
        await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL), error.message)

    async def ChatCompletion(self, request, context):
        try:
            principal = await self._principal(context)
            body = ChatCompletionRequest(
                model=request.model,
                messages=[{"role": m.role, "content": m.content} for m in request.messages],
                stream=True,
                **options_dict(request.options),
            )
            messages = [
                tokenizer_pb2.ChatMessage(role=m.role, content=m.text()) for m in body.messages
            ]
            prompt_ids = await self._service.prepare_chat(body.model, messages, body.max_tokens)
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except APIError as exc:
            await self._abort(context, exc)
        async for chunk in self._stream(principal, "chatcmpl", body, prompt_ids, context):
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
            prompt_ids = await self._service.prepare_text(body.model, body.prompt, body.max_tokens)
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except APIError as exc:
            await self._abort(context, exc)
        async for chunk in self._stream(principal, "cmpl", body, prompt_ids, context):
            yield chunk

    async def _stream(self, principal, prefix, body, prompt_ids, context):
        request_id = new_request_id(prefix)
        deltas = self._service.generate(
            principal,
            request_id,
            body.model,
            prompt_ids,
            to_engine_sampling(body),
            session_id=body.user or "",
        )
        try:
            async for delta in deltas:
                if delta.finish_reason == "error":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the model stopped mid-stream")
                chunk = gateway_pb2.CompletionChunk(
                    id=request_id, model=body.model, text=delta.text
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
        except APIError as exc:
            await self._abort(context, exc)
        finally:
            await deltas.aclose()

    async def ListModels(self, request, context):
        try:
            await self._principal(context)
            models = await self._service.list_models()
        except APIError as exc:
            await self._abort(context, exc)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m, owned_by="maas") for m in models]
        )
