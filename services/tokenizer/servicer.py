"""maas.v1.Tokenizer: chat templates, encode, decode and length checks.

Errors map to gRPC codes the gateway turns into OpenAI errors: an unknown
model is NOT_FOUND, a bad conversation, an over-long prompt or a token id
outside the vocabulary INVALID_ARGUMENT, a full encode pool RESOURCE_EXHAUSTED.
A grammar that cannot be compiled, or not within the deadline, is
INVALID_ARGUMENT naming the problem (grammar_check.py).

Work is bounded before it starts: a text too long for any encoding is refused
on its character count (length_check.check_chars), token-id prompts on their
count and then their range, and rendering and encoding run on the bounded
EncodePool, never on the event loop.
"""

import asyncio
import time

import grpc
from prometheus_client import Histogram

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.chat_template import ChatTemplateError
from services.common.length_check import ContextLengthError, check_chars, check_length
from services.common.metrics import LATENCY_BUCKETS
from services.common.text_tokenizer import TextTokenizer
from services.engine.grammar.proto import grammar_from_proto
from services.engine.grammar.spec import GrammarError
from services.tokenizer.encode_pool import EncodePool, PoolFullError
from services.tokenizer.grammar_check import GrammarChecker

TOKENIZE_SECONDS = Histogram(
    "maas_tokenizer_tokenize_seconds",
    "Time to render and encode one request, the wait for a thread included",
    ["operation"],
    buckets=LATENCY_BUCKETS,
)


class TokenIdError(ValueError):
    pass


def check_token_ids(ids, vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise TokenIdError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(
        self,
        model_id: str,
        tokenizer: TextTokenizer,
        max_model_len: int,
        pool: EncodePool,
        grammar_timeout_s: float = 10.0,
    ):
        self._model_id = model_id
        self._tok = tokenizer
        self._max_model_len = max_model_len
        self._pool = pool
        # Derived from the vocabulary once, at startup, not on the first request's time.
        self._max_token_chars = tokenizer.max_token_chars
        self._grammars = GrammarChecker(tokenizer)
        self._grammar_timeout_s = grammar_timeout_s

    async def _check_model(self, model: str, context: grpc.aio.ServicerContext) -> None:
        if model and model != self._model_id:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {model!r} is not served here (this tokenizer serves {self._model_id!r})",
            )

    async def _run(self, operation: str, context, fn, *args):
        """fn(*args) on the pool; the client's errors become INVALID_ARGUMENT."""
        started = time.perf_counter()
        try:
            result = await self._pool.run(fn, *args)
        except (ChatTemplateError, ContextLengthError, TokenIdError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except PoolFullError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        TOKENIZE_SECONDS.labels(operation).observe(time.perf_counter() - started)
        return result

    def _encoded(self, prompt: str, ids: list[int], max_tokens: int):
        check_length(len(ids), max_tokens, self._max_model_len)
        return tokenizer_pb2.EncodeResponse(
            token_ids=ids, prompt=prompt, max_model_len=self._max_model_len
        )

    def _check_chars(self, text: str, max_tokens: int) -> None:
        check_chars(len(text), max_tokens, self._max_model_len, self._max_token_chars)

    def _render_and_encode(self, messages, add_generation_prompt: bool, max_tokens: int):
        prompt = self._tok.render_chat(messages, add_generation_prompt)
        # The template may add or drop text: only the rendered prompt's length counts.
        self._check_chars(prompt.text, max_tokens)
        return self._encoded(prompt.text, self._tok.encode_prompt(prompt), max_tokens)

    def _encode(self, text: str, add_special_tokens: bool, max_tokens: int):
        return self._encoded(text, self._tok.encode(text, add_special_tokens), max_tokens)

    async def RenderChat(self, request, context):
        await self._check_model(request.model, context)
        messages = [
            {"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
            for m in request.messages
        ]
        if not messages:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages must not be empty")
        return await self._run(
            "render_chat",
            context,
            self._render_and_encode,
            messages,
            request.add_generation_prompt,
            request.max_tokens,
        )

    async def Encode(self, request, context):
        await self._check_model(request.model, context)
        try:
            if request.token_ids:
                return self._token_id_prompt(request)
            self._check_chars(request.text, request.max_tokens)
        except (ContextLengthError, TokenIdError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return await self._run(
            "encode",
            context,
            self._encode,
            request.text,
            request.add_special_tokens,
            request.max_tokens,
        )

    def _token_id_prompt(self, request) -> tokenizer_pb2.EncodeResponse:
        if request.text:
            raise TokenIdError("send the prompt as text or as token ids, not both")
        ids = request.token_ids
        # The count first: a refused prompt of a million ids costs no pass over them.
        check_length(len(ids), request.max_tokens, self._max_model_len)
        check_token_ids(ids, self._tok.vocab_size)
        return tokenizer_pb2.EncodeResponse(token_ids=ids, max_model_len=self._max_model_len)

    async def Decode(self, request, context):
        await self._check_model(request.model, context)
        try:
            check_token_ids(request.token_ids, self._tok.vocab_size)
        except TokenIdError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        ids, skip = list(request.token_ids), request.skip_special_tokens
        text = await self._run("decode", context, self._tok.decode, ids, skip)
        return tokenizer_pb2.DecodeResponse(text=text)

    async def Count(self, request, context):
        await self._check_model(request.model, context)
        ids = await self._run(
            "count", context, self._tok.encode, request.text, request.add_special_tokens
        )
        return tokenizer_pb2.CountResponse(count=len(ids), max_model_len=self._max_model_len)

    async def ValidateGrammar(self, request, context):
        await self._check_model(request.model, context)
        try:
            spec = grammar_from_proto(request.grammar)
            await asyncio.wait_for(
                self._pool.run(self._grammars.check, spec), self._grammar_timeout_s
            )
        except GrammarError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the grammar did not compile within {self._grammar_timeout_s:g} s; simplify it",
            )
        except PoolFullError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return tokenizer_pb2.ValidateGrammarResponse()
