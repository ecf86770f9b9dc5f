"""What a batch line can ask for: each endpoint's body checked, and answered through the pipeline.

The same code as the interactive routes builds each request (chat_request,
text_request, responses/translate.py) and each answer (http_stream.collect,
responses/output.ResponseRender), so a batch line's response body is the one
the route would have returned for the same request, streaming aside: a batch
answers whole bodies, so `stream: true` is refused, as is what needs the
tenant's stored responses (`previous_response_id`; batch responses are not
stored).

An endpoint's answer admits its own runs through `admit` (the worker's: its
gate, Pipeline.admit and BatchRun), so a line of several requests (an
embeddings line, one per input) goes through the same admission as any line.
"""

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import msgspec
from pydantic import BaseModel, ValidationError

from maas_services.common.openai_api.embeddings import (
    EmbeddingRequest,
    embedding_list,
    embedding_requests,
    named,
    returned,
)
from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.common.openai_api.openai_format import ResponseShape
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.parsed_request import (
    ParsedRequest,
    chat_request,
    text_request,
)
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest
from maas_services.gateway.http_api.http_stream import STREAM_BROKEN, collect
from maas_services.gateway.responses.output import ResponseRender, new_id
from maas_services.gateway.responses.request import ResponsesRequest
from maas_services.gateway.responses.translate import translate
from maas_services.gateway.run import Run

TYPE_TAGS = {"str", "int", "float", "bool"}


@dataclass(frozen=True)
class Prepared:
    """A line's requests, checked and built: what admission takes (one, but an
    embeddings line's inputs)."""

    body: BaseModel
    requests: tuple[ParsedRequest, ...]

    @property
    def parsed(self) -> ParsedRequest:
        """The line's request; an embeddings line's first input (its request id)."""
        return self.requests[0]


# admit(request, input index) -> its BatchRun, entered: index None for a line of one request.
Admit = Callable[[ParsedRequest, int | None], AbstractAsyncContextManager[Run]]


class Endpoint(Protocol):
    url: str

    def prepare(self, body: dict) -> Prepared: ...

    async def answer(
        self, admit: Admit, prepared: Prepared, output_filter: OutputFilter
    ) -> dict: ...


def validated(schema: type[BaseModel], body: dict) -> BaseModel:
    """The body as `schema`, or a 400 naming the field under `body`."""
    try:
        checked = schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        names = [
            str(part)
            for part in first.get("loc", ())
            if isinstance(part, int)
            or (str(part).isidentifier() and not str(part)[0].isupper() and part not in TYPE_TAGS)
        ]
        param = ".".join(["body", *names])
        raise bad_request(f"Invalid value for '{param}': {first.get('msg')}", param=param) from None
    if getattr(checked, "stream", False):
        raise bad_request("stream is not supported in a batch.", param="body.stream")
    return checked


@dataclass(frozen=True)
class Completions:
    """/v1/chat/completions and /v1/completions."""

    url: str
    chat: bool

    def prepare(self, body: dict) -> Prepared:
        schema = ChatCompletionRequest if self.chat else CompletionRequest
        checked = validated(schema, body)
        parsed = (chat_request if self.chat else text_request)(checked, None)
        return Prepared(checked, (parsed,))

    async def answer(self, admit: Admit, prepared: Prepared, output_filter: OutputFilter) -> dict:
        async with admit(prepared.parsed, None) as run:
            return await self._collect(run, prepared, output_filter)

    async def _collect(self, run: Run, prepared: Prepared, output_filter: OutputFilter) -> dict:
        shape = ResponseShape.answering(
            prepared.parsed, prepared.body, self.chat, run.ticket.prompt.tool_format
        )
        first = await anext(run.deltas)
        return await collect(shape, first, run.deltas, output_filter)


@dataclass(frozen=True)
class Responses:
    url: str = "/v1/responses"

    def prepare(self, body: dict) -> Prepared:
        checked = validated(ResponsesRequest, body)
        if checked.previous_response_id is not None:
            raise bad_request(
                "previous_response_id is not supported in a batch.",
                param="body.previous_response_id",
            )
        checked.store = False
        turn = translate(checked, new_id("resp"), None, None)
        return Prepared(checked, (turn.parsed,))

    async def answer(self, admit: Admit, prepared: Prepared, output_filter: OutputFilter) -> dict:
        async with admit(prepared.parsed, None) as run:
            return await self._render(run, prepared, output_filter)

    async def _render(self, run: Run, prepared: Prepared, output_filter: OutputFilter) -> dict:
        render = ResponseRender(
            new_id("resp"),
            prepared.body,
            output_filter,
            tool_mode=prepared.parsed.tool_mode,
            tool_format=run.ticket.prompt.tool_format,
        )
        async for delta in run.deltas:
            if render.ended:
                continue
            render.feed(delta)
            if render.ended and delta.finish_reason is None:
                break  # ended by the filter: closing the run stops the engine
        if render.status == "failed":
            raise STREAM_BROKEN
        return render.response()


@dataclass(frozen=True)
class Embeddings:
    """/v1/embeddings: each input admitted as its own request, as the route admits
    them, but one at a time: a batch is not in a hurry, and one input in flight
    per line leaves the idle capacity it runs in to other lines and tenants. Each
    input is billed under its own index (batch_run.usage_id), so a line run again
    bills every input once. The body is the route's (embedding_list); the first
    input refused or failed is the line's answer, naming the input, as the
    route's is."""

    url: str = "/v1/embeddings"

    def prepare(self, body: dict) -> Prepared:
        checked = validated(EmbeddingRequest, body)
        return Prepared(checked, tuple(embedding_requests(checked, None)))

    async def answer(self, admit: Admit, prepared: Prepared, output_filter: OutputFilter) -> dict:
        vectors, prompt_tokens = [], 0
        for index, parsed in enumerate(prepared.requests):
            try:
                async with admit(parsed, index) as run:
                    async for _ in run.deltas:
                        pass
                    vectors.append(returned(run.embedding))
                    prompt_tokens += len(run.ticket.prompt.token_ids)
                # Its concurrency lease ends with its bill: the next input is not
                # refused for it (Run.billed).
                await run.billed()
            except APIError as exc:
                raise named(exc, index, len(prepared.requests)) from None
        body = prepared.body
        return msgspec.json.decode(
            embedding_list(body.model, vectors, prompt_tokens, body.encoding_format)
        )


ENDPOINTS: dict[str, Endpoint] = {
    e.url: e
    for e in (
        Completions("/v1/chat/completions", chat=True),
        Completions("/v1/completions", chat=False),
        Responses(),
        Embeddings(),
    )
}


def endpoint_for(url: str, param: str = "url") -> Endpoint:
    found = ENDPOINTS.get(url)
    if found is None:
        raise bad_request(
            f"'{url}' is not a supported batch endpoint; use one of {', '.join(ENDPOINTS)}.",
            param=param,
        )
    return found
