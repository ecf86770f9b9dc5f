"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API.

A response is a chat completion underneath (responses/translate.py): the
same pipeline admits it (limits, quota, fair queue), the same Run streams
its deltas and owns its end (slot, TPM settlement, usage event), so it is
billed exactly as a chat completion. Rendered here as a Response object or
its typed SSE events (responses/output.py), then stored when `store` is
true (responses/store.py), before its last event is sent, so the id a
client reads in `response.completed` can already be chained or retrieved.

A stored response belongs to its tenant: another tenant's id, like an
unknown, deleted or expired one, is a 404 (its existence is not told).
"""

from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.background import BackgroundTask

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.gateway.http_api.disconnect import ClientGoneError, cancelled_if_gone
from maas_services.gateway.http_api.http_metrics import RESPONSES
from maas_services.gateway.http_api.http_stream import STREAM_BROKEN, EventStream, gone, prepend
from maas_services.gateway.http_api.routes.deps import GatewayDep, PrincipalDep, release_body
from maas_services.gateway.pipeline import with_headers
from maas_services.gateway.responses.output import ResponseRender, new_id
from maas_services.gateway.responses.request import ResponsesRequest
from maas_services.gateway.responses.store import ResponseStore
from maas_services.gateway.responses.translate import Translated, assistant_message, translate
from maas_services.gateway.run import Run

log = get_logger(__name__)
router = APIRouter()

ROUTE = "/v1/responses"
# One metric label for every id (an id per label value would grow without end).
ITEM_ROUTE = "/v1/responses/{response_id}"
_ENCODE = msgspec.json.Encoder().encode


def frame(event: dict) -> bytes:
    """One typed SSE event, named as its type (OpenAI's framing)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + _ENCODE(event) + b"\n\n"


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'.", param=param)


async def response_store(gw: GatewayDep) -> ResponseStore:
    if gw.responses is None:
        raise unavailable("stored responses are not configured on this gateway")
    return gw.responses


StoreDep = Annotated[ResponseStore, Depends(response_store)]


@router.post(ROUTE)
async def create_response(body: ResponsesRequest, request: Request, gw: GatewayDep) -> Response:
    principal = request.state.principal
    store = await response_store(gw)
    previous = await _conversation(store, principal.tenant.name, body.previous_response_id)
    response_id = new_id("resp")
    turn = translate(body, response_id, previous, request.headers.get("x-session-id"))
    # From here the request's text lives in turn (the prompt, and what is stored):
    # no other copy is held through the answer.
    del previous
    body.input = ""
    release_body(request)
    try:
        # A client gone while its request waits gives its place up at once.
        with cancelled_if_gone(request.scope):
            run = await gw.pipeline.admit(principal, turn.parsed)
    except ClientGoneError:
        return gone(ROUTE)
    render = ResponseRender(
        response_id,
        body,
        gw.pipeline.output_filter,
        tool_mode=turn.parsed.tool_mode,
        tool_format=run.ticket.prompt.tool_format,
        store=body.store,
    )
    keep = Keeper(store, principal.tenant.name, turn, render) if body.store else None
    try:
        return await _answer(request, body.stream, run, render, keep)
    except APIError as exc:
        await run.close()
        raise with_headers(exc, run.headers) from None
    except BaseException:
        await run.close()
        raise


async def _conversation(store: ResponseStore, tenant: str, previous_id: str | None):
    """The stored conversation previous_id continues; None when there is none to continue."""
    if previous_id is None:
        return None
    found = await _read(store.get(tenant, previous_id))
    if found is None:
        raise not_found(previous_id, param="previous_response_id")
    return found.conversation


class Keeper:
    """Stores a finished response with the conversation a next turn continues from."""

    def __init__(self, store: ResponseStore, tenant: str, turn: Translated, render: ResponseRender):
        self.store, self.tenant, self.turn, self.render = store, tenant, turn, render

    async def __call__(self) -> None:
        render = self.render
        if render.status == "failed":
            return
        render.store = True
        conversation = [
            *self.turn.conversation,
            assistant_message(render.text(), render.calls()),
        ]
        try:
            render.store = await self.store.put(
                self.tenant, render.response_id, render.response(), conversation
            )
        except (SQLAlchemyError, OSError):
            # Generated and billed already: the client gets its answer, marked not stored.
            log.exception("response_store_failed", response_id=render.response_id)
            render.store = False
        if not render.store:
            log.warning("response_not_stored", response_id=render.response_id)


async def _answer(
    request: Request, stream: bool, run: Run, render: ResponseRender, keep: Keeper | None
) -> Response:
    deltas = run.deltas
    try:
        # The first delta before answering, so failures before any token
        # (no capacity, a bad prompt) still get their status code.
        with cancelled_if_gone(request.scope):
            first = await anext(deltas)
            if not stream:
                async for _ in _rendered(render, first, deltas):
                    pass
    except ClientGoneError:
        await run.close()
        return gone(ROUTE)
    if not stream:
        if render.status == "failed":
            raise STREAM_BROKEN
        if keep is not None:
            await keep()
        RESPONSES.labels(ROUTE, 200).inc()
        return JSONResponse(
            render.response(), headers=run.headers, background=BackgroundTask(run.close)
        )

    async def events():
        # Left after the last event was sent, or when the client left.
        async with run:
            for event in render.start():
                yield frame(event)
            async for event in _rendered(render, first, deltas):
                yield frame(event)
            if keep is not None:
                await keep()
            yield frame(render.end())

    RESPONSES.labels(ROUTE, 200).inc()
    return EventStream(events(), media_type="text/event-stream", headers=run.headers)


async def _rendered(
    render: ResponseRender, first: Delta, deltas: AsyncIterator[Delta]
) -> AsyncIterator[dict]:
    """Every delta's events, until the deltas end or the response has."""
    async for delta in prepend(first, deltas):
        if render.ended:
            continue
        for event in render.feed(delta):
            yield event
        if render.ended and delta.finish_reason is None:
            # Ended here, not by the engine (the filter blocked a call): closing
            # the run then stops the engine's work.
            return


async def _read(reading):
    """A store call; the store unreachable is a 503, not a bug."""
    try:
        return await reading
    except (SQLAlchemyError, OSError) as exc:
        log.warning("response_store_unreachable", error=repr(exc))
        raise unavailable("the response store is unreachable; try again") from exc


@router.get(ITEM_ROUTE)
async def retrieve_response(response_id: str, who: PrincipalDep, store: StoreDep) -> Response:
    found = await _read(store.get(who.tenant.name, response_id))
    if found is None:
        return _missing(response_id)
    RESPONSES.labels(ITEM_ROUTE, 200).inc()
    return JSONResponse(found.body)


@router.delete(ITEM_ROUTE)
async def delete_response(response_id: str, who: PrincipalDep, store: StoreDep) -> Response:
    if not await _read(store.delete(who.tenant.name, response_id)):
        return _missing(response_id)
    RESPONSES.labels(ITEM_ROUTE, 200).inc()
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _missing(response_id: str) -> Response:
    error = not_found(response_id)
    RESPONSES.labels(ITEM_ROUTE, error.status).inc()
    return JSONResponse(error.body(), status_code=error.status)
