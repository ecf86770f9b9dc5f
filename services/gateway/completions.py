"""The request path shared by the HTTP and gRPC fronts.

prepare: model exists? -> tokenizer renders/encodes and checks the length.
generate: router picks an engine -> engine streams deltas -> on the way out,
release the pick and publish the usage event. That last step runs as its own
task so a client disconnect (which cancels the stream) cannot cancel billing.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from maas.v1 import common_pb2, engine_pb2, router_pb2, tokenizer_pb2
from services.common.logging import get_logger
from services.common.usage_event import UsageEvent
from services.gateway.errors import APIError, from_upstream, model_not_found, unavailable
from services.gateway.model_catalog import ModelCatalog
from services.gateway.tenants import Principal
from services.gateway.upstreams import Upstreams
from services.gateway.usage_emitter import UsageEmitter

log = get_logger(__name__)

FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
}


@dataclass
class Delta:
    """One engine message: a sample's new text; the usage fields are running totals."""

    text: str
    index: int = 0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    logprobs: list[engine_pb2.TokenLogprob] = field(default_factory=list)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class CompletionService:
    def __init__(
        self,
        upstreams: Upstreams,
        catalog: ModelCatalog,
        usage: UsageEmitter,
        request_timeout: float,
    ):
        self._up = upstreams
        self._catalog = catalog
        self._usage = usage
        self._timeout = request_timeout
        self._background: set[asyncio.Task] = set()

    async def list_models(self) -> list[str]:
        try:
            return sorted(await self._catalog.models())
        except grpc.aio.AioRpcError as exc:
            raise unavailable(f"the model catalog is unreachable: {exc.code().name}") from exc

    async def require_model(self, model: str) -> None:
        if model not in await self.list_models():
            raise model_not_found(model)

    async def prepare_chat(
        self, model: str, messages: list[tokenizer_pb2.ChatMessage], max_tokens: int | None
    ) -> list[int]:
        await self.require_model(model)
        request = tokenizer_pb2.RenderChatRequest(
            model=model, messages=messages, add_generation_prompt=True, max_tokens=max_tokens or 0
        )
        try:
            encoded = await self._up.tokenizer.RenderChat(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_upstream(exc, model, param="messages") from exc
        return list(encoded.token_ids)

    async def prepare_text(
        self, model: str, prompt: str | list[int], max_tokens: int | None
    ) -> list[int]:
        await self.require_model(model)
        if isinstance(prompt, list):
            # Token ids go straight to the engine, which checks their range and
            # the context length with the same rule the tokenizer uses.
            return list(prompt)
        request = tokenizer_pb2.EncodeRequest(
            model=model, text=prompt, add_special_tokens=True, max_tokens=max_tokens or 0
        )
        try:
            encoded = await self._up.tokenizer.Encode(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_upstream(exc, model, param="prompt") from exc
        if not encoded.token_ids:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return list(encoded.token_ids)

    async def generate(
        self,
        principal: Principal,
        request_id: str,
        model: str,
        prompt_ids: list[int],
        sampling: engine_pb2.SamplingParams,
        session_id: str = "",
    ) -> AsyncIterator[Delta]:
        """Stream deltas; errors before the first token raise APIError.

        A stream that breaks after tokens were sent ends with a delta whose
        finish_reason is "error"; what was generated is still billed.
        """
        started = time.time()
        pick = await self._pick(request_id, model, prompt_ids, principal, session_id)
        stub = self._up.engine(pick.address)
        call = stub.Generate(
            engine_pb2.GenerateRequest(
                request_id=request_id,
                model=model,
                prompt_token_ids=prompt_ids,
                sampling=sampling,
                tenant=principal.tenant.name,
            ),
            timeout=self._timeout,
        )
        completion_tokens, finish, first_token_at = 0, "", 0.0
        cached = 0
        try:
            async for response in call:
                completion_tokens += len(response.token_ids)
                if response.token_ids and not first_token_at:
                    first_token_at = time.time()
                finish = FINISH_NAMES.get(response.finish_reason, "")
                if response.HasField("usage"):
                    cached = response.usage.cached_prompt_tokens
                yield Delta(
                    text=response.text,
                    index=response.index,
                    finish_reason=finish or None,
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=completion_tokens,
                    cached_prompt_tokens=cached,
                    logprobs=list(response.logprobs),
                )
        except grpc.aio.AioRpcError as exc:
            finish = "error"
            if completion_tokens == 0:
                raise from_upstream(exc, model) from exc
            log.warning("engine_stream_broken", request_id=request_id, code=exc.code().name)
            yield Delta(
                text="",
                finish_reason="error",
                prompt_tokens=len(prompt_ids),
                completion_tokens=completion_tokens,
                cached_prompt_tokens=cached,
            )
        finally:
            call.cancel()
            event = UsageEvent(
                request_id=request_id,
                tenant=principal.tenant.name,
                key_id=principal.key_id,
                model=model,
                deployment=model,
                endpoint=pick.endpoint_id,
                prompt_tokens=len(prompt_ids),
                cached_prompt_tokens=cached,
                completion_tokens=completion_tokens,
                finish_reason=finish or "client_disconnect",
                started_at=started,
                ttft_seconds=max(0.0, first_token_at - started) if first_token_at else 0.0,
                duration_seconds=time.time() - started,
            )
            self._in_background(self._finish(request_id, pick.endpoint_id, event))

    async def _pick(
        self, request_id: str, model: str, prompt_ids: list[int], principal: Principal, session: str
    ) -> router_pb2.PickResponse:
        request = router_pb2.PickRequest(
            request_id=request_id,
            model=model,
            token_ids=prompt_ids,
            tenant=principal.tenant.name,
            session_id=session,
        )
        try:
            return await self._up.router.Pick(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_upstream(exc, model) from exc

    async def _finish(self, request_id: str, endpoint_id: str, event: UsageEvent) -> None:
        if event.completion_tokens > 0:
            await self._usage.emit(event)
        try:
            await self._up.router.Release(
                router_pb2.ReleaseRequest(
                    request_id=request_id,
                    endpoint_id=endpoint_id,
                    success=event.finish_reason in ("stop", "length"),
                ),
                timeout=5,
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("router_release_failed", request_id=request_id, code=exc.code().name)

    def _in_background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_background(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
