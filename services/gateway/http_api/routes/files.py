"""POST /v1/files (an ASGI handler of its own), GET /v1/files, GET and DELETE
/v1/files/{id}, GET /v1/files/{id}/content.

An upload is streamed (batches/upload.py), so it cannot go through BodyGuard,
which reads a whole JSON body of at most max_body_bytes before any route:
`FileUploads` sits between AuthGate (the key is checked before a byte is read)
and BodyGuard, and answers POST /v1/files itself. A file belongs to its
tenant: another tenant's id is a 404, as an unknown one.
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.common.openai_api.refusal import refuse
from maas_services.gateway.batches.file_store import FileStore, not_found
from maas_services.gateway.batches.service import BatchService
from maas_services.gateway.http_api.http_metrics import RESPONSES
from maas_services.gateway.http_api.routes.deps import GatewayDep, PrincipalDep


def list_page(data: list[dict], more: bool) -> dict:
    """One page of a list, as OpenAI pages files and batches (cursor `after`)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


router = APIRouter()

ROUTE = "/v1/files"
ITEM_ROUTE = "/v1/files/{file_id}"
CONTENT_ROUTE = "/v1/files/{file_id}/content"


async def batch_service(gw: GatewayDep) -> BatchService:
    if gw.batch_service is None:
        raise unavailable("files and batches are not configured on this gateway")
    return gw.batch_service


async def file_store(service: Annotated[BatchService, Depends(batch_service)]) -> FileStore:
    return service.files


FilesDep = Annotated[FileStore, Depends(file_store)]


class FileUploads:
    """ASGI middleware answering POST /v1/files with a streamed upload."""

    def __init__(self, app: ASGIApp):
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != ROUTE:
            await self._app(scope, receive, send)
            return
        service = scope["app"].state.gateway.batch_service
        try:
            if service is None:
                raise unavailable("files and batches are not configured on this gateway")
            made = await service.uploads.receive_file(
                scope, receive, scope["state"]["principal"].tenant
            )
        except APIError as error:
            RESPONSES.labels(ROUTE, error.status).inc()
            await refuse(send, error)
            return
        RESPONSES.labels(ROUTE, 200).inc()
        await JSONResponse(made.object())(scope, receive, send)


@router.get(ROUTE)
async def list_files(
    who: PrincipalDep,
    files: FilesDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    purpose: str | None = None,
) -> Response:
    found, more = await files.page(who.tenant.name, after, limit, purpose)
    RESPONSES.labels(ROUTE, 200).inc()
    return JSONResponse(list_page([f.object() for f in found], more))


@router.get(ITEM_ROUTE)
async def retrieve_file(file_id: str, who: PrincipalDep, files: FilesDep) -> Response:
    found = await files.get(who.tenant.name, file_id)
    if found is None:
        raise not_found(file_id)
    RESPONSES.labels(ITEM_ROUTE, 200).inc()
    return JSONResponse(found.object())


@router.delete(ITEM_ROUTE)
async def delete_file(file_id: str, who: PrincipalDep, files: FilesDep) -> Response:
    if not await files.delete(who.tenant.name, file_id):
        raise not_found(file_id)
    RESPONSES.labels(ITEM_ROUTE, 200).inc()
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get(CONTENT_ROUTE)
async def file_content(file_id: str, who: PrincipalDep, files: FilesDep) -> Response:
    found = await files.get(who.tenant.name, file_id)
    if found is None:
        raise not_found(file_id)
    RESPONSES.labels(CONTENT_ROUTE, 200).inc()
    # Streamed from the blob a chunk at a time, as it was stored.
    return StreamingResponse(
        files.blobs.read(file_id),
        media_type="application/jsonl",
        headers={"content-length": str(found.bytes)},
    )
