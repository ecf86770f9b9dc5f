"""POST /v1/batches, GET /v1/batches (paginated), GET /v1/batches/{id},
POST /v1/batches/{id}/cancel: OpenAI's Batch API.

A batch runs its input file's requests in capacity interactive traffic leaves
idle (batches/worker.py, batches/idle_capacity.py) and is billed at the batch
price. Its input file was checked line by line when uploaded; here the batch
must name that file (the tenant's own, purpose "batch") and the endpoint every
line names. Another tenant's batch or file id is a 404.
"""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from maas_services.common.openai_api.errors import bad_request
from maas_services.gateway.batches.batch_store import not_found
from maas_services.gateway.batches.endpoints import endpoint_for
from maas_services.gateway.batches.file_store import UPLOAD_PURPOSE
from maas_services.gateway.batches.file_store import not_found as file_not_found
from maas_services.gateway.batches.service import BatchService
from maas_services.gateway.http_api.http_metrics import RESPONSES
from maas_services.gateway.http_api.routes.deps import PrincipalDep, release_body
from maas_services.gateway.http_api.routes.files import batch_service, list_page

router = APIRouter()

ROUTE = "/v1/batches"
ITEM_ROUTE = "/v1/batches/{batch_id}"
CANCEL_ROUTE = "/v1/batches/{batch_id}/cancel"

ServiceDep = Annotated[BatchService, Depends(batch_service)]


class BatchRequest(BaseModel):
    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: str = Field(min_length=1, max_length=64)
    completion_window: Literal["24h"]
    # OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512.
    metadata: (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None
    ) = Field(None, max_length=16)


@router.post(ROUTE)
async def create_batch(
    body: BatchRequest, request: Request, who: PrincipalDep, service: ServiceDep
) -> Response:
    release_body(request)
    tenant = who.tenant.name
    endpoint_for(body.endpoint, param="endpoint")
    found = await service.files.get(tenant, body.input_file_id)
    if found is None or found.purpose != UPLOAD_PURPOSE:
        raise file_not_found(body.input_file_id, param="input_file_id")
    if found.endpoint != body.endpoint:
        raise bad_request(
            f"The requests in file {body.input_file_id} are for "
            f"{found.endpoint or 'several endpoints'}, not {body.endpoint}; a batch's lines "
            "all name its endpoint.",
            param="endpoint",
        )
    batch_id = await service.batches.create(
        tenant,
        who.key_id,
        body.input_file_id,
        body.endpoint,
        body.completion_window,
        body.metadata,
    )
    made = await service.batches.get(tenant, batch_id)
    RESPONSES.labels(ROUTE, 200).inc()
    return JSONResponse(made.object())


@router.get(ROUTE)
async def list_batches(
    who: PrincipalDep,
    service: ServiceDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    found, more = await service.batches.page(who.tenant.name, after, limit)
    RESPONSES.labels(ROUTE, 200).inc()
    return JSONResponse(list_page([b.object() for b in found], more))


@router.get(ITEM_ROUTE)
async def retrieve_batch(batch_id: str, who: PrincipalDep, service: ServiceDep) -> Response:
    found = await service.batches.get(who.tenant.name, batch_id)
    if found is None:
        raise not_found(batch_id)
    RESPONSES.labels(ITEM_ROUTE, 200).inc()
    return JSONResponse(found.object())


@router.post(CANCEL_ROUTE)
async def cancel_batch(batch_id: str, who: PrincipalDep, service: ServiceDep) -> Response:
    found = await service.batches.cancel(who.tenant.name, batch_id)
    if found is None:
        raise not_found(batch_id)
    RESPONSES.labels(CANCEL_ROUTE, 200).inc()
    return JSONResponse(found.object())
