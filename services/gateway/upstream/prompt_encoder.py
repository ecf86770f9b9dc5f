"""The tokenize step: the tokenizer service renders, encodes and checks the length.

Token-id prompts go through it too: it checks their count and range, which
the router would otherwise pay for by hashing every id before the engine
refused them.
"""

from dataclasses import dataclass

import grpc

from maas.v1 import tokenizer_pb2
from maas_services.common.openai_api.errors import APIError, from_upstream
from maas_services.common.openai_api.parsed_request import ChatPrompt, TextPrompt


@dataclass
class Prompt:
    token_ids: list[int]
    max_model_len: int
    # How the prompt asked for tool calls: the parser for the answer (tool_parsers/).
    tool_format: str = ""


class PromptEncoder:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    async def encode(
        self, model: str, prompt: ChatPrompt | TextPrompt, max_tokens: int | None
    ) -> Prompt:
        """`model` is the route's tokenizer; max_tokens is the client's (None: unset)."""
        if isinstance(prompt, ChatPrompt):
            request = tokenizer_pb2.RenderChatRequest(
                model=model,
                messages=prompt.messages,
                tools=prompt.tools,
                add_generation_prompt=True,
                max_tokens=max_tokens or 0,
            )
            encoded = await self._call(self._tokenizer.RenderChat, request, model, "messages")
        else:
            text = prompt.text
            request = tokenizer_pb2.EncodeRequest(
                model=model,
                text=text if isinstance(text, str) else "",
                token_ids=text if isinstance(text, list) else (),
                add_special_tokens=True,
                max_tokens=max_tokens or 0,
            )
            encoded = await self._call(self._tokenizer.Encode, request, model, "prompt")
            if not encoded.token_ids:
                raise APIError(400, "prompt must not be empty", param="prompt")
        return Prompt(list(encoded.token_ids), encoded.max_model_len, encoded.tool_format)

    async def check_grammar(self, model: str, grammar, param: str, tenant: str) -> None:
        """The tokenizer compiles it: a 400 naming `param` if it cannot be used, a 429
        if the tenant is over its compile bounds (one in flight, its CPU-seconds budget:
        services/tokenizer/compile_admission.py). The tokenizer answers only once the
        compile has ended, so the tenant's concurrency slot is held until then."""
        request = tokenizer_pb2.ValidateGrammarRequest(model=model, grammar=grammar, tenant=tenant)
        try:
            await self._tokenizer.ValidateGrammar(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise _compile_refused(exc, param) from exc
            raise from_upstream(exc, model, param=param) from exc

    @staticmethod
    async def _call(method, request, model: str, param: str):
        try:
            return await method(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise from_upstream(exc, model, param=param) from exc


def _compile_refused(exc: grpc.aio.AioRpcError, param: str) -> APIError:
    """The tenant's own excess, not a shortage: 429 with the tokenizer's Retry-After."""
    trailers = dict(exc.trailing_metadata() or ())
    retry_after = trailers.get("retry-after", "1")
    return APIError(
        429,
        f"grammar compile refused: {exc.details()}",
        type="requests",
        code="rate_limit_exceeded",
        param=param,
        headers={"Retry-After": retry_after if retry_after.isdigit() else "1"},
    )
