"""One OpenAI completion through this engine: the prompt's ids, then the engine's outputs.

The request is read exactly as maas's gateway reads it (its schemas, its
ParsedRequest with the sampling proto and the grammar), the prompt rendered
and encoded with the tokenizer code the tokenizer service runs (chat
templates in which only the template writes control tokens, text encoded
with the model's special tokens), and the sampling proto turned into the
engine's SamplingParams by the function the gRPC servicer uses; the answer is
shaped by the gateway's ResponseShape. So a request means the same at either
door, and what this front adds is only the glue.

An embedding input (embedding.py) takes the same way: its prompt encoded and
checked here, its outputs (one, the vector) from the same engine call.

Bounded before it costs: a text too long for the context in any encoding is
refused on its character count before it is encoded (length_check), and
rendering and encoding run on a thread, never on the loop that serves every
stream. The engine refuses the rest on its own terms (prompt ids out of the
vocabulary, the context length, impossible sampling values), which costs
only the request's own add, and the answer is a 400 naming it.

`model` names this engine's model or an adapter it has loaded (--lora-modules,
or loaded at POST /v1/load_lora_adapter: adapters.py); the request then runs
with that adapter, and anything else is a 404 model_not_found.

The front has no tenants: every request is the engine's empty tenant (a
direct caller's), never a name taken from the body, which anyone could set
to read another tenant's prefix cache by its timing.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from maas_services.common.chat_messages import decoded_tools, message_dict
from maas_services.common.chat_template import ChatTemplateError
from maas_services.common.defaults import default_max_tokens
from maas_services.common.grammar.spec import GrammarError
from maas_services.common.length_check import ContextLengthError, check_chars
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.errors import (
    APIError,
    bad_request,
    model_not_found,
    unavailable,
)
from maas_services.common.openai_api.parsed_request import ChatPrompt, ParsedRequest
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.engine.async_engine import AsyncEngine, CoreDied, EngineFailed, RequestFailed
from maas_services.engine.lora.errors import AdapterError, AdapterNotFound, AdapterSlotsFull
from maas_services.engine.request import SeqOutput
from maas_services.engine.servicer import response_of, sampling_from_proto


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    # The parser for the answer's tool calls (chat with tools), as the template wrote them.
    tool_format: str = ""


def engine_error(exc: Exception) -> APIError:
    """What the client sees of an engine failure (as the gateway maps the gRPC codes)."""
    if isinstance(exc, RequestFailed):
        return bad_request(str(exc))
    if isinstance(exc, CoreDied):
        return unavailable(str(exc))
    if isinstance(exc, AdapterNotFound):  # unloaded since check_servable saw it
        return APIError(404, str(exc), code="model_not_found", param="model")
    if isinstance(exc, AdapterSlotsFull):
        return unavailable(str(exc))
    if isinstance(exc, AdapterError):  # a bad adapter, or LoRA off (--max-loras 0)
        return bad_request(str(exc))
    return APIError(500, str(exc), type="api_error", code="internal_error")


@dataclass
class EngineFront:
    """What the routes need of this engine: its model, its AsyncEngine, its tokenizer."""

    model_id: str
    engine: AsyncEngine
    tokenizer: TextTokenizer
    # The gRPC servicer's flag: a draining engine (or one that failed its
    # known-answer check) takes nothing new at either door.
    draining: Callable[[], bool]

    def check_servable(self, model: str) -> str:
        """The adapter `model` names ("" for the base model), or the APIError refusing it."""
        if model == self.model_id:
            adapter = ""
        elif model in self.engine.adapters:
            adapter = model
        else:
            raise model_not_found(model)
        if self.draining() or self.engine.death is not None:
            raise unavailable("engine is draining")
        return adapter

    async def prompt(self, parsed: ParsedRequest) -> Prompt:
        try:
            return await asyncio.to_thread(self._encode, parsed)
        except (ChatTemplateError, ContextLengthError) as exc:
            param = "messages" if _is_chat(parsed) else "prompt"
            raise bad_request(str(exc), param=param) from None

    def _encode(self, parsed: ParsedRequest) -> Prompt:
        tokenizer, max_model_len = self.tokenizer, self.engine.info.max_model_len
        max_tokens = parsed.sampling.max_tokens
        if _is_chat(parsed):
            messages = [message_dict(m) for m in parsed.prompt.messages]
            rendered = tokenizer.render_chat(messages, True, decoded_tools(parsed.prompt.tools))
            check_chars(len(rendered.text), max_tokens, max_model_len, tokenizer.max_token_chars)
            return Prompt(tokenizer.encode_prompt(rendered), rendered.tool_format)
        text = parsed.prompt.text
        if isinstance(text, list):
            return Prompt(list(text))  # token ids: the engine checks their range and count
        check_chars(len(text), max_tokens, max_model_len, tokenizer.max_token_chars)
        # The caller's own raw prompt: special tokens it writes are honoured (as vLLM does).
        return Prompt(tokenizer.encode(text, add_special_tokens=True))

    async def outputs(
        self, parsed: ParsedRequest, prompt: Prompt, adapter: str
    ) -> AsyncIterator[SeqOutput]:
        """The engine's outputs for the request (with adapter, if named); APIError for a
        failure."""
        unset = default_max_tokens(self.engine.info.max_model_len, len(prompt.token_ids))
        try:
            params = sampling_from_proto(parsed.sampling, unset)
        except GrammarError as exc:
            raise bad_request(f"grammar: {exc}", param=parsed.grammar_param or None) from None
        outputs = self.engine.generate(parsed.request_id, prompt.token_ids, params, adapter=adapter)
        try:
            async for output in outputs:
                yield output
        except (RequestFailed, EngineFailed, CoreDied, AdapterError) as exc:
            raise engine_error(exc) from None
        finally:
            # A client gone mid-stream: the engine aborts the request at once.
            await outputs.aclose()

    async def deltas(
        self, parsed: ParsedRequest, prompt: Prompt, adapter: str
    ) -> AsyncIterator[Delta]:
        """The engine's outputs as the gateway's Deltas; APIError for a failure."""
        async with aclosing(self.outputs(parsed, prompt, adapter)) as outputs:
            async for output in outputs:
                # The logprobs' token texts, as the gRPC answer carries them.
                logprobs = response_of(output, self.tokenizer).logprobs if output.logprobs else ()
                yield Delta(
                    output.text,
                    output.index,
                    output.finish_reason,
                    output.prompt_tokens,
                    output.completion_tokens,
                    output.cached_prompt_tokens,
                    logprobs,
                )


def _is_chat(parsed: ParsedRequest) -> bool:
    return isinstance(parsed.prompt, ChatPrompt)
