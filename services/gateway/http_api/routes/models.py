"""GET /v1/models: the names this key may send now."""

from fastapi import APIRouter

from maas_services.gateway.http_api.routes.deps import PipelineDep, PrincipalDep

router = APIRouter()


@router.get("/v1/models")
async def list_models(who: PrincipalDep, pipe: PipelineDep):
    models = await pipe.models(who.tenant)
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "maas"} for m in models],
    }
