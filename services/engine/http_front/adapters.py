"""LoRA adapters loaded and unloaded over HTTP, as vLLM's server spells it.

POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST
/v1/unload_lora_adapter {"lora_name"} (vLLM's runtime LoRA API, which
production-stack's and AIBrix's controllers call): 200 with vLLM's plain-text
success line, or an OpenAI error body. The engine answers them as it answers
the gRPC LoadAdapter and UnloadAdapter (the core applies them between steps):
a bad adapter or LoRA off (--max-loras 0) is a 400, every slot busy a 503 to
retry, and unloading one not loaded a 404, as vLLM answers it. They sit
behind the service token (token_gate.py), like completions.
"""

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import PlainTextResponse

from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.schemas import MAX_MODEL_CHARS, Text
from maas_services.engine.http_front.completion import EngineFront, engine_error
from maas_services.engine.lora.errors import AdapterError

# A path on the engine's file system.
MAX_PATH_CHARS = 4096


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: Text = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    lora_path: Text = Field(min_length=1, max_length=MAX_PATH_CHARS)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: Text = Field(min_length=1, max_length=MAX_MODEL_CHARS)


async def load(front: EngineFront, body: LoadLoraAdapterRequest) -> PlainTextResponse:
    try:
        await front.engine.load_adapter(body.lora_name, body.lora_path)
    except (AdapterError, RuntimeError) as exc:  # RuntimeError: the core died, or a bug
        raise engine_error(exc) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload(front: EngineFront, body: UnloadLoraAdapterRequest) -> PlainTextResponse:
    try:
        found = await front.engine.unload_adapter(body.lora_name)
    except (AdapterError, RuntimeError) as exc:  # RuntimeError: the core died, or a bug
        raise engine_error(exc) from None
    if not found:
        raise APIError(
            404,
            f"The LoRA adapter '{body.lora_name}' is not loaded.",
            code="model_not_found",
            param="lora_name",
        )
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
