"""POST /v1/embeddings: the request validated, each input as the pipeline takes it, and
the response in OpenAI's shape.

`input` is a string, a list of strings, a list of token ids, or a list of
lists of token ids (OpenAI's four forms); an empty string or list is refused,
as OpenAI does, and so is a list of more than MAX_INPUTS inputs. Each input
becomes a request of its own (a TextPrompt the tokenizer encodes and checks
against the model's context, like a completion's prompt), with
`sampling.embedding` set and no tokens to generate.

`encoding_format: "base64"` is each vector's little-endian float32 bytes in
base64, as OpenAI sends them (the SDK decodes them with numpy's frombuffer).

Both doors that embed (the gateway's route and the engine's HTTP front) run a
request's inputs through each_input: at most IN_FLIGHT of them in the engines
at once, and while more than one is in flight, at most TOKENS_IN_FLIGHT
prompt tokens (TokenWindow). An engine step computes up to 2048 prompt tokens
beside its decodes, so another caller's stream pays for every token of the
list in the step it shares. Measured on the real stack (docs/embeddings.md):
with eight 300-token inputs in flight another tenant's chat request (0.3 s
alone) took 16.6 s, with the window (two) at most 4.3 s, for the same
embedding throughput; short inputs still go eight at a time, 2.6x the inputs
per second of two. The answer is all or nothing: the first input refused or
failed stops the others and is the request's answer, naming the input by its
index (named).
"""

import asyncio
import base64
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Literal, TypeVar

import msgspec
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from maas.v1 import engine_pb2
from maas_services.common.defaults import MAX_NUM_BATCHED_TOKENS
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.parsed_request import (
    ParsedRequest,
    TextPrompt,
    _session,
    new_request_id,
)
from maas_services.common.openai_api.schemas import (
    INT32_MAX,
    MAX_MODEL_CHARS,
    MAX_PROMPT_IDS,
    Text,
)

_ENCODE = msgspec.json.Encoder().encode
# OpenAI's limit on inputs in one embeddings request.
MAX_INPUTS = 2048
# Inputs of one request in flight at once, at most (the module docstring).
IN_FLIGHT = 8
# Prompt tokens of one request in flight at once once it has more than one:
# half an engine step's default budget.
TOKENS_IN_FLIGHT = MAX_NUM_BATCHED_TOKENS // 2
# English runs about four characters a token; the window needs no more than a
# guess before the tokenizer has counted.
CHARS_PER_TOKEN = 4
T = TypeVar("T")

FORMS = (
    "input must be a string, a list of strings, a list of token ids, "
    "or a list of lists of token ids"
)


def _token_ids(ids: list) -> None:
    if len(ids) > MAX_PROMPT_IDS:
        raise PydanticCustomError(
            "too_long", f"input has {len(ids)} token ids; at most {MAX_PROMPT_IDS} are allowed"
        )
    for token in ids:
        if type(token) is not int or not 0 <= token <= INT32_MAX:
            raise PydanticCustomError(
                "token_id", f"input token ids must be integers from 0 to {INT32_MAX}"
            )


def _one_form(value):
    """Plain words for each shape a client gets wrong (a union's own errors name
    its members' types), checked before pydantic validates the items."""
    if isinstance(value, str):
        if not value:
            raise PydanticCustomError("empty", "input must not be an empty string")
        return value
    if not isinstance(value, list) or (value and type(value[0]) not in (str, list, int)):
        raise PydanticCustomError("form", FORMS)
    if not value:
        raise PydanticCustomError("empty", "input must not be an empty list")
    if type(value[0]) is int:
        _token_ids(value)
        return value
    if len(value) > MAX_INPUTS:
        raise PydanticCustomError(
            "too_long", f"input has {len(value)} items; at most {MAX_INPUTS} are allowed"
        )
    kind = type(value[0])
    for item in value:
        if type(item) is not kind:
            raise PydanticCustomError("form", FORMS)
        if not item:
            raise PydanticCustomError("empty", "input must not hold an empty string or list")
        if kind is list:
            _token_ids(item)
    return value


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    input: Annotated[
        # _one_form has checked the shape, sizes and token ids; Text checks the strings.
        # Each list stops at its first mismatch: a union tries its members in turn.
        Annotated[list[list[int]], Field(fail_fast=True)]
        | Annotated[list[int], Field(fail_fast=True)]
        | Annotated[list[Text], Field(fail_fast=True)]
        | Text,
        BeforeValidator(_one_form),
    ]
    encoding_format: Literal["float", "base64"] = "float"
    # Keep the vector's first `dimensions` components, renormalized (the engine's
    # Embedding.dimensions); above the model's hidden size the engine refuses it.
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX)
    user: Text | None = Field(None, max_length=256)

    def inputs(self) -> list[str | list[int]]:
        """Each input: a string or token ids."""
        value = self.input
        if isinstance(value, str) or isinstance(value[0], int):
            return [value]
        return list(value)


def embedding_requests(body: EmbeddingRequest, session_header: str | None) -> list[ParsedRequest]:
    """One request per input, in input order."""
    sampling = engine_pb2.SamplingParams(
        n=1, embedding=engine_pb2.Embedding(dimensions=body.dimensions or 0)
    )
    session = _session(session_header, body.user)
    return [
        ParsedRequest(
            request_id=new_request_id("embd"),
            model=body.model,
            prompt=TextPrompt(text),
            sampling=sampling,
            session_id=session,
        )
        for text in body.inputs()
    ]


def returned(vector: Sequence[float]) -> Sequence[float]:
    """An input's vector once its run has ended; none is the engine's failure (502)."""
    if not vector:
        raise APIError(
            502, "the model returned no embedding", type="api_error", code="upstream_error"
        )
    return vector


def encoded(vector: Sequence[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


def embedding_list(
    model: str, vectors: list[Sequence[float]], prompt_tokens: int, encoding_format: str
) -> bytes:
    """OpenAI's response as JSON: the vectors in input order, usage in input tokens
    only. Written one item at a time, so a list of 2048 vectors is never also
    held as Python floats all at once (the JSON is the one copy)."""
    items = b",".join(
        _ENCODE(
            {"object": "embedding", "index": index, "embedding": encoded(vector, encoding_format)}
        )
        for index, vector in enumerate(vectors)
    )
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    tail = _ENCODE({"model": model, "usage": usage})
    return b'{"object":"list","data":[' + items + b"]," + tail[1:]


class TokenWindow:
    """Prompt tokens in flight: an input waits while others hold `budget`; one
    alone always goes, however long."""

    def __init__(self, budget: int):
        self._budget = budget
        self._used = 0
        self._changed = asyncio.Condition()

    async def take(self, tokens: int) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self._used or self._used + tokens <= self._budget
            )
            self._used += tokens

    async def give(self, tokens: int) -> None:
        async with self._changed:
            self._used -= tokens
            self._changed.notify_all()


def guessed_tokens(parsed: ParsedRequest) -> int:
    text = parsed.prompt.text
    return len(text) if isinstance(text, list) else -(-len(text) // CHARS_PER_TOKEN)


async def each_input(
    inputs: list[ParsedRequest], width: int, embed_one: Callable[[ParsedRequest], Awaitable[T]]
) -> list[T]:
    """embed_one of every input, in input order, at most `width` (up to IN_FLIGHT)
    in flight within the TokenWindow; the first failure, named, cancels the rest."""
    results: list[T | None] = [None] * len(inputs)
    todo = iter(enumerate(inputs))
    window = TokenWindow(TOKENS_IN_FLIGHT)

    async def slot() -> None:
        for index, parsed in todo:
            tokens = guessed_tokens(parsed)
            await window.take(tokens)
            try:
                results[index] = await embed_one(parsed)
            except APIError as exc:
                raise named(exc, index, len(inputs)) from None
            finally:
                await window.give(tokens)

    slots = [asyncio.create_task(slot()) for _ in range(min(width, IN_FLIGHT, len(inputs)))]
    try:
        await asyncio.gather(*slots)
    finally:
        for task in slots:
            task.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
    return results


def named(error: APIError, index: int, count: int) -> APIError:
    """The field a refusal is about: the tokenizer names the prompt (a text over
    the model's context), the engine nothing (its refusals of `dimensions`
    above the model's size say so); the client sent `input`."""
    if error.status == 400 and error.param in (None, "prompt"):
        error.param = "dimensions" if "dimensions" in error.message else "input"
        if count > 1 and error.param == "input":
            error.message = f"input[{index}]: {error.message}"
    return error
