"""GET /v1/models and GET /v1/models/{id}: the names this key may send now.

Both answer from one list (Pipeline.models, filtered by the tenant's tier and
allowed models), so a name a key cannot list is a name it cannot retrieve:
another tenant's private alias or LoRA adapter is a 404 `model_not_found`, as
OpenAI answers for a model the key has no access to, never a hint that it
exists. An adapter is listed with `parent`, its base model, as OpenAI lists a
fine-tune.
"""

from fastapi import APIRouter

from maas_services.common.openai_api.errors import model_not_found
from maas_services.gateway.http_api.routes.deps import PipelineDep, PrincipalDep

router = APIRouter()


def model_object(name: str, parent: str = "") -> dict:
    found = {"id": name, "object": "model", "created": 0, "owned_by": "maas"}
    return {**found, "parent": parent} if parent else found


@router.get("/v1/models")
async def list_models(who: PrincipalDep, pipe: PipelineDep):
    models = await pipe.models(who.tenant)
    return {"object": "list", "data": [model_object(m, p) for m, p in models.items()]}


# :path, since a model id may hold a slash ("org/name"), as Hugging Face ids do.
@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, who: PrincipalDep, pipe: PipelineDep):
    models = await pipe.models(who.tenant)
    if model_id not in models:
        raise model_not_found(model_id)
    return model_object(model_id, models[model_id])
