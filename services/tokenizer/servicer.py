"""maas.v1.Tokenizer: chat templates, encode, decode and length checks.

Errors map to gRPC codes the gateway turns into OpenAI errors: an unknown
model is NOT_FOUND, a bad conversation or an over-long prompt INVALID_ARGUMENT.
"""

import time

import grpc
from prometheus_client import Histogram

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.chat_template import ChatTemplateError, render_chat
from services.common.metrics import LATENCY_BUCKETS
from services.common.text_tokenizer import TextTokenizer
from services.tokenizer.length_check import ContextLengthError, check_length

TOKENIZE_SECONDS = Histogram(
    "maas_tokenizer_tokenize_seconds",
    "Time to render and encode one request",
    ["operation"],
    buckets=LATENCY_BUCKETS,
)


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, model_id: str, tokenizer: TextTokenizer, max_model_len: int):
        self._model_id = model_id
        self._tok = tokenizer
        self._max_model_len = max_model_len

    async def _check_model(self, model: str, context: grpc.aio.ServicerContext) -> None:
        if model and model != self._model_id:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {model!r} is not served here (this tokenizer serves {self._model_id!r})",
            )

    async def _encoded(
        self, prompt: str, ids: list[int], max_tokens: int, context
    ) -> tokenizer_pb2.EncodeResponse:
        try:
            check_length(len(ids), max_tokens, self._max_model_len)
        except ContextLengthError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return tokenizer_pb2.EncodeResponse(
            token_ids=ids, prompt=prompt, max_model_len=self._max_model_len
        )

    async def RenderChat(self, request, context):
        await self._check_model(request.model, context)
        started = time.perf_counter()
        messages = [
            {"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
            for m in request.messages
        ]
        if not messages:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages must not be empty")
        try:
            prompt = render_chat(
                self._tok.chat_template,
                messages,
                add_generation_prompt=request.add_generation_prompt,
                bos_token=self._tok.bos_token,
                eos_token=self._tok.eos_token,
            )
        except ChatTemplateError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        ids = self._tok.encode(prompt)
        TOKENIZE_SECONDS.labels("render_chat").observe(time.perf_counter() - started)
        return await self._encoded(prompt, ids, request.max_tokens, context)

    async def Encode(self, request, context):
        await self._check_model(request.model, context)
        started = time.perf_counter()
        ids = self._tok.encode(request.text, add_special_tokens=request.add_special_tokens)
        TOKENIZE_SECONDS.labels("encode").observe(time.perf_counter() - started)
        return await self._encoded(request.text, ids, request.max_tokens, context)

    async def Decode(self, request, context):
        await self._check_model(request.model, context)
        vocab = self._tok.vocab_size
        bad = [i for i in request.token_ids if not 0 <= i < vocab]
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"token ids out of range [0, {vocab}): {bad[:5]}",
            )
        text = self._tok.decode(list(request.token_ids), request.skip_special_tokens)
        return tokenizer_pb2.DecodeResponse(text=text)

    async def Count(self, request, context):
        await self._check_model(request.model, context)
        ids = self._tok.encode(request.text, add_special_tokens=request.add_special_tokens)
        return tokenizer_pb2.CountResponse(count=len(ids), max_model_len=self._max_model_len)
