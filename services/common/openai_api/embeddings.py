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
"""

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from maas.v1 import engine_pb2
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
