"""POST /v1/completions (the legacy text completions API)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response

from maas_services.common.openai_api.parsed_request import text_request
from maas_services.common.openai_api.schemas import CompletionRequest
from maas_services.gateway.http_api.http_stream import respond
from maas_services.gateway.http_api.routes.deps import PipelineDep, release_body

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, pipe: PipelineDep) -> Response:
    parsed = text_request(body, request.headers.get("x-session-id"))
    release_body(request)
    return await respond(request, pipe, parsed, body, chat=False)
