"""POST /v1/chat/completions."""

from fastapi import APIRouter, Request
from fastapi.responses import Response

from maas_services.common.openai_api.parsed_request import chat_request
from maas_services.common.openai_api.schemas import ChatCompletionRequest
from maas_services.gateway.http_api.http_stream import respond
from maas_services.gateway.http_api.routes.deps import PipelineDep, release_body

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, pipe: PipelineDep
) -> Response:
    parsed = chat_request(body, request.headers.get("x-session-id"))
    release_body(request)
    return await respond(request, pipe, parsed, body, chat=True)
