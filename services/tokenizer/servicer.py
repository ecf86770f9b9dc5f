"""maas.v1.Tokenizer: chat templates, encode, decode and length checks.

Each request's `model` names the deployment whose tokenizer, chat template
and context length apply (registry.py); empty means the default deployment.
Errors map to gRPC codes the gateway turns into OpenAI errors: an unknown
deployment is NOT_FOUND, one whose tokenizer cannot be loaded UNAVAILABLE,
a bad conversation, an over-long prompt or a token id outside the
vocabulary INVALID_ARGUMENT, a full encode pool RESOURCE_EXHAUSTED.
A grammar that cannot be compiled, is over a cost cap, or does not compile
within the deadline is INVALID_ARGUMENT naming the problem; a tenant over
its compile bounds (one in flight, its CPU-seconds budget) or a tokenizer
with too many compiles in flight is RESOURCE_EXHAUSTED, with a retry-after
trailer (grammar_validator.py).

Work is bounded before it starts: a text too long for any encoding is refused
on its character count (length_check.check_chars), token-id prompts on their
count and then their range, and rendering and encoding of anything but a
small request run on the bounded EncodePool, never on the event loop. A small
one (at most INLINE_BYTES on the wire and INLINE_MESSAGES messages) is done on
the loop: a short chat takes ~0.2 ms there, less than the hop to a thread
and back cost (two wakeups and a GIL handoff), and it is never queued behind
a long prompt. The caps bound the worst: text that is a token a byte (digits)
encodes at up to ~3 us a byte, so 512 bytes of it hold the loop ~1.6 ms on
this host's EPYC (4 KiB held it 12 ms: too long for the loop).
"""

import time

import grpc
from prometheus_client import Histogram

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common.chat_messages import decoded_tools, message_dict
from maas_services.common.chat_template import ChatTemplateError
from maas_services.common.grammar.proto import grammar_from_proto
from maas_services.common.grammar.spec import GrammarError
from maas_services.common.length_check import ContextLengthError, check_chars, check_length
from maas_services.common.metrics import LATENCY_BUCKETS
from maas_services.tokenizer.compile_admission import CompileRefused
from maas_services.tokenizer.encode_pool import EncodePool, PoolFullError
from maas_services.tokenizer.grammar_validator import GrammarValidator
from maas_services.tokenizer.registry import (
    Deployment,
    DeploymentLoadError,
    TokenizerRegistry,
    UnknownDeploymentError,
)

TOKENIZE_SECONDS = Histogram(
    "maas_tokenizer_tokenize_seconds",
    "Time to render and encode one request, the wait for a thread included",
    ["operation"],
    buckets=LATENCY_BUCKETS,
)


# What may run on the event loop: rendering costs ~17 us a message, encoding up to ~3 us a byte.
INLINE_BYTES = 512
INLINE_MESSAGES = 8


class TokenIdError(ValueError):
    pass


def check_token_ids(ids, vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise TokenIdError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, registry: TokenizerRegistry, pool: EncodePool, grammars: GrammarValidator):
        self._registry = registry
        self._pool = pool
        self._grammars = grammars

    async def _deployment(self, model: str, context: grpc.aio.ServicerContext) -> Deployment:
        try:
            return await self._registry.get(model)
        except UnknownDeploymentError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {model!r} is not served here (this tokenizer serves "
                f"{', '.join(map(repr, self._registry.names()))})",
            )
        except DeploymentLoadError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _run(self, operation: str, context, inline: bool, fn, *args):
        """fn(*args), on the pool unless `inline`; the client's errors become INVALID_ARGUMENT."""
        started = time.perf_counter()
        try:
            result = fn(*args) if inline else await self._pool.run(fn, *args)
        except (ChatTemplateError, ContextLengthError, TokenIdError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except PoolFullError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        TOKENIZE_SECONDS.labels(operation).observe(time.perf_counter() - started)
        return result

    @staticmethod
    def _encoded(dep: Deployment, prompt: str, ids: list[int], max_tokens: int):
        check_length(len(ids), max_tokens, dep.max_model_len)
        return tokenizer_pb2.EncodeResponse(
            token_ids=ids, prompt=prompt, max_model_len=dep.max_model_len
        )

    @staticmethod
    def _check_chars(dep: Deployment, text: str, max_tokens: int) -> None:
        check_chars(len(text), max_tokens, dep.max_model_len, dep.max_token_chars)

    def _render_and_encode(
        self, dep: Deployment, messages, add_generation_prompt: bool, max_tokens: int, tools: str
    ):
        prompt = dep.tokenizer.render_chat(messages, add_generation_prompt, decoded_tools(tools))
        # The template may add or drop text: only the rendered prompt's length counts.
        self._check_chars(dep, prompt.text, max_tokens)
        encoded = self._encoded(dep, prompt.text, dep.tokenizer.encode_prompt(prompt), max_tokens)
        encoded.tool_format = prompt.tool_format
        return encoded

    def _encode(self, dep: Deployment, text: str, add_special_tokens: bool, max_tokens: int):
        ids = dep.tokenizer.encode(text, add_special_tokens)
        return self._encoded(dep, text, ids, max_tokens)

    async def RenderChat(self, request, context):
        dep = await self._deployment(request.model, context)
        messages = [message_dict(m) for m in request.messages]
        if not messages:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "messages must not be empty")
        small = len(messages) <= INLINE_MESSAGES and request.ByteSize() <= INLINE_BYTES
        return await self._run(
            "render_chat",
            context,
            small,
            self._render_and_encode,
            dep,
            messages,
            request.add_generation_prompt,
            request.max_tokens,
            request.tools,
        )

    async def Encode(self, request, context):
        dep = await self._deployment(request.model, context)
        try:
            if request.token_ids:
                return self._token_id_prompt(dep, request)
            self._check_chars(dep, request.text, request.max_tokens)
        except (ContextLengthError, TokenIdError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return await self._run(
            "encode",
            context,
            request.ByteSize() <= INLINE_BYTES,
            self._encode,
            dep,
            request.text,
            request.add_special_tokens,
            request.max_tokens,
        )

    @staticmethod
    def _token_id_prompt(dep: Deployment, request) -> tokenizer_pb2.EncodeResponse:
        if request.text:
            raise TokenIdError("send the prompt as text or as token ids, not both")
        ids = request.token_ids
        # The count first: a refused prompt of a million ids costs no pass over them.
        check_length(len(ids), request.max_tokens, dep.max_model_len)
        check_token_ids(ids, dep.tokenizer.vocab_size)
        return tokenizer_pb2.EncodeResponse(token_ids=ids, max_model_len=dep.max_model_len)

    async def Decode(self, request, context):
        dep = await self._deployment(request.model, context)
        try:
            check_token_ids(request.token_ids, dep.tokenizer.vocab_size)
        except TokenIdError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        ids, skip = list(request.token_ids), request.skip_special_tokens
        text = await self._run("decode", context, False, dep.tokenizer.decode, ids, skip)
        return tokenizer_pb2.DecodeResponse(text=text)

    async def Count(self, request, context):
        dep = await self._deployment(request.model, context)
        ids = await self._run(
            "count",
            context,
            False,
            dep.tokenizer.encode,
            request.text,
            request.add_special_tokens,
        )
        return tokenizer_pb2.CountResponse(count=len(ids), max_model_len=dep.max_model_len)

    async def ValidateGrammar(self, request, context):
        dep = await self._deployment(request.model, context)
        try:
            spec = grammar_from_proto(request.grammar)
            seconds = await self._grammars.validate(dep.grammars, spec, request.tenant)
        except GrammarError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except CompileRefused as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return tokenizer_pb2.ValidateGrammarResponse(compile_seconds=seconds)
