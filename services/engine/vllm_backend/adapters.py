"""LoRA adapters on the vLLM server: LoadAdapter and UnloadAdapter through vLLM's
runtime API, with the native engine's refusals (services/engine/lora/errors.py).

vLLM serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter only when
started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and adapters at all only
with --enable-lora (its --max-loras, --max-lora-rank, --max-cpu-loras and
--lora-modules are the flags our engine copies). What it holds is what its
/v1/models lists with a parent (both those loaded here and --lora-modules'),
so an adapter restarted beside a running vLLM reports them too.

vLLM's answers, as our engine's:
- the same name and source again: the adapter as it is (vLLM would refuse the
  second load); the same name from another source: INVALID_ARGUMENT, as our
  engine says (vLLM's load_inplace would keep prefix-cache blocks computed with
  the old weights);
- no LoRA (max_loras 0), or no runtime API: FAILED_PRECONDITION;
- its 4xx, or its 500 from the load (vLLM wraps every failure to read or fit
  an adapter: a rank above --max-lora-rank, a missing file, modules the model
  lacks): INVALID_ARGUMENT, and vLLM keeps nothing of it;
- vLLM unreachable: VllmUnavailable (UNAVAILABLE).
vLLM evicts idle adapters least recently used past --max-cpu-loras itself, so
a load is never refused for room (no RESOURCE_EXHAUSTED).

An unload removes the name, so new requests naming it get NOT_FOUND; vLLM
finishes running ones and drops the weights when it needs their room.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from maas_services.engine.lora.adapter import CONFIG_FILE
from maas_services.engine.lora.errors import AdapterInvalid, LoraDisabled
from maas_services.engine.vllm_backend.completion_stream import (
    VllmUnavailable,
    error_message,
    json_or_text,
)

RUNTIME_API_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass(frozen=True)
class VllmAdapter:
    name: str
    # 0: the adapter process cannot read the folder (only vLLM needs to).
    rank: int
    source: str


async def loaded_adapters(client: httpx.AsyncClient) -> dict[str, str]:
    """name -> source of the adapters vLLM holds. Raises httpx.HTTPError."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    return {m["id"]: m.get("root") or "" for m in response.json()["data"] if m.get("parent")}


async def load_adapter(
    client: httpx.AsyncClient, name: str, source: str, max_loras: int
) -> VllmAdapter:
    if not max_loras:
        raise LoraDisabled("this engine serves no adapters (vLLM runs without --enable-lora)")
    try:
        response = await client.post(
            "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": source}
        )
        # vLLM refuses a name it holds; the same source again (or a load racing
        # this one) is ours to answer as done.
        held = await loaded_adapters(client) if response.status_code != 200 else {}
    except httpx.HTTPError as exc:
        raise VllmUnavailable(f"vLLM load_lora_adapter: {exc!r}") from exc
    if name in held:
        if held[name] != source:
            raise AdapterInvalid(
                f"adapter {name!r} is loaded from {held[name]!r}; "
                f"unload it before loading {source!r} under that name"
            )
    else:
        _raise_for_refusal(response, "load")
    return VllmAdapter(name, _rank(source), source)


async def unload_adapter(client: httpx.AsyncClient, name: str, max_loras: int) -> bool:
    """Whether vLLM held it."""
    if not max_loras:
        return False  # as our engine: nothing is loaded where nothing can be
    try:
        response = await client.post("/v1/unload_lora_adapter", json={"lora_name": name})
    except httpx.HTTPError as exc:
        raise VllmUnavailable(f"vLLM unload_lora_adapter: {exc!r}") from exc
    if response.status_code == 404 and _vllm_error(response):
        return False
    _raise_for_refusal(response, "unload")
    return True


def _raise_for_refusal(response: httpx.Response, what: str) -> None:
    if response.status_code == 200:
        return
    if response.status_code == 404 and not _vllm_error(response):
        # The route itself is missing: vLLM runs without its runtime LoRA API.
        raise LoraDisabled(f"vLLM cannot {what} adapters at run time (no {RUNTIME_API_ENV}=True)")
    if response.status_code in (502, 503, 504):
        raise VllmUnavailable(f"vLLM answered {response.status_code} to an adapter {what}")
    raise AdapterInvalid(
        f"vLLM could not {what} it: {error_message(json_or_text(response.content))}"
    )


def _vllm_error(response: httpx.Response) -> bool:
    """vLLM's own error object, as opposed to the web framework's 404 for no route."""
    body = json_or_text(response.content)
    return isinstance(body, dict) and "error" in body


def _rank(source: str) -> int:
    try:
        rank = json.loads((Path(source) / CONFIG_FILE).read_text()).get("r")
    except (OSError, ValueError, AttributeError):
        return 0
    return rank if isinstance(rank, int) else 0
