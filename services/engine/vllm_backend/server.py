"""`maas serve engine --backend vllm`: wait for vLLM, check it, then serve maas.v1.Engine.

Start order: vLLM's /health answers; /v1/models names the model and its
context length; its tokenizer must be ours (tokenizer_check.py), else the
process exits 1 with `vllm_tokenizer_mismatch`; /metrics gives the block size
and pool size; vLLM's known-answer check (known_answer.py: a failure leaves
the server NOT_SERVING, the reason in its log and GetLoad); the preload
adapters (--lora-modules, load_lora_modules); then the KV-event subscription
and the gRPC server start.

A vLLM server runs one runner, so the adapter serves generation or
embeddings (--serves embed: a vLLM started with its pooling runner,
embeddings.py), never both. An embedding adapter has no known-answer check:
vLLM's pooling runner has no prompt logprobs to score; a start-up embedding
of one token checks that it pools at all.
SIGTERM drains as the native engine does: new requests get UNAVAILABLE while
those in flight finish.
"""

import asyncio
import dataclasses
import os
import time

import httpx

from maas.v1 import engine_pb2_grpc
from maas_services.common import event_loop
from maas_services.common.grpc_server import GrpcService, run_until_signalled, start_server
from maas_services.common.logging import get_logger
from maas_services.common.model_files import resolve_model_path
from maas_services.common.serves import EMBED, VLLM_POOLING_ARGS
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.core.adapter_limits import check_adapter_name
from maas_services.engine.lora.errors import AdapterError
from maas_services.engine.server import SERVICE_NAME, stay_not_serving
from maas_services.engine.settings import EngineSettings
from maas_services.engine.vllm_backend.adapters import (
    load_adapter,
    loaded_adapters,
    unload_adapter,
)
from maas_services.engine.vllm_backend.cache_salt import SaltBook
from maas_services.engine.vllm_backend.completion_stream import VllmRequestError, VllmUnavailable
from maas_services.engine.vllm_backend.embeddings import embed
from maas_services.engine.vllm_backend.known_answer import check_vllm
from maas_services.engine.vllm_backend.kv_subscriber import KvSubscriber
from maas_services.engine.vllm_backend.kv_translation import KvTranslator
from maas_services.engine.vllm_backend.load import LoadCache
from maas_services.engine.vllm_backend.servicer import VllmEngineServicer, VllmInfo
from maas_services.engine.vllm_backend.tokenizer_check import tokenizer_mismatch

log = get_logger(__name__)
HEALTH_POLL_SECONDS = 0.5
# vLLM's own variable for its key; the adapter beside it reads the same one.
API_KEY_ENV = "VLLM_API_KEY"


def vllm_client(url: str) -> httpx.AsyncClient:
    """The client of one vLLM server, showing vLLM's API key when the pod gives one.

    The key comes from VLLM_API_KEY, the variable vLLM itself reads its key
    from (docs/security.md, "Trust in the cluster"): never a flag.
    """
    key = os.environ.get(API_KEY_ENV, "")
    # No read timeout: a stream is as long as its generation. No pool cap:
    # admission is the gateway's and vLLM's, not the connection pool's.
    return httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"} if key else None,
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


async def wait_healthy(client: httpx.AsyncClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            log.error("vllm_not_healthy", url=str(client.base_url), timeout=timeout)
            raise SystemExit(1)
        await asyncio.sleep(HEALTH_POLL_SECONDS)


async def probe(client: httpx.AsyncClient, settings: EngineSettings, tokenizer) -> VllmInfo:
    models = (await client.get("/v1/models")).raise_for_status().json()["data"]
    served = models[0]
    mismatch = await tokenizer_mismatch(client, served["id"], tokenizer)
    if mismatch is not None:
        log.error(
            "vllm_tokenizer_mismatch",
            vllm_model=served["id"],
            model_path=settings.model_path or "bundled",
            differs=mismatch,
        )
        raise SystemExit(1)
    load = await LoadCache(client).get()
    return VllmInfo(
        model_id=settings.model_id,
        served_model=served["id"],
        max_model_len=served.get("max_model_len") or settings.max_model_len,
        # vLLM publishes no scheduler limits; the deployment passes its --max-num-seqs.
        max_num_seqs=settings.max_num_seqs,
        block_size=load.block_size or settings.block_size,
        num_blocks=load.num_blocks,
        cache_salt=settings.cache_salt or settings.model_id,
        prefix_cache_sharing=settings.prefix_cache_sharing,
        serves=tuple(settings.served),
    )


async def check_pooling(client: httpx.AsyncClient, served_model: str) -> None:
    """Exit 1 unless vLLM embeds: a generation runner answers /v1/embeddings with an error."""
    try:
        await embed(client, served_model, [0], cache_salt="start-up check")
    except (VllmRequestError, VllmUnavailable) as exc:
        log.error("vllm_not_pooling", error=str(exc), hint=" ".join(VLLM_POOLING_ARGS))
        raise SystemExit(1) from exc


async def load_lora_modules(
    client: httpx.AsyncClient, modules: dict[str, str], max_loras: int
) -> None:
    """--lora-modules (name -> folder; MAAS_LORA_MODULES in a pod) into vLLM before the
    adapter serves, as the native engine loads them before it is ready: a new replica
    serves its preload adapters from its first request, not from the operator's next
    round. Through vLLM's runtime API rather than vLLM's own --lora-modules: vLLM's
    command line is the pod template's, and a change of the list must restart no pod
    (docs/operator.md). An adapter restarted beside a running vLLM finds them held;
    one held from another folder is replaced, this list being what the replica serves.
    SystemExit(1) at the first that fails, with vLLM's reason, as the native engine.

    max_loras: this engine's --max-loras, above 0 wherever --lora-modules is set
    (settings.py), not vLLM's: vLLM publishes its own only from its first step on,
    and --known-answer off runs none before this. A vLLM without LoRA refuses the
    load itself."""
    if not modules:
        return
    try:
        held = await loaded_adapters(client)
    except httpx.HTTPError as exc:
        log.error("engine_lora_modules_failed", error=repr(exc))
        raise SystemExit(1) from exc
    for name, source in modules.items():
        try:
            check_adapter_name(name)
            if held.get(name, source) != source:
                await unload_adapter(client, name, max_loras)
            await load_adapter(client, name, source, max_loras)
        except (AdapterError, VllmUnavailable) as exc:
            log.error("engine_lora_module_failed", adapter=name, source=source, error=str(exc))
            raise SystemExit(1) from exc
        log.info("adapter_loaded", name=name, source=source)


async def serve(settings: EngineSettings) -> None:
    if not settings.vllm_url:
        log.error("vllm_url_missing", hint="--backend vllm needs --vllm-url")
        raise SystemExit(2)
    if len(settings.served) > 1:
        log.error("vllm_serves_both", hint="vLLM runs one runner: --serves generate or embed")
        raise SystemExit(2)
    client = vllm_client(settings.vllm_url)
    try:
        await wait_healthy(client, settings.vllm_startup_timeout)
        tokenizer = await asyncio.to_thread(load_tokenizer, resolve_model_path(settings.model_path))
        info = await probe(client, settings, tokenizer)
        if EMBED in info.serves:
            await check_pooling(client, info.served_model)
            failure = ""
        else:
            # A vLLM that computes this model wrongly here (#32) never serves.
            failure = await check_vllm(client, info.served_model, tokenizer, settings)
        info = dataclasses.replace(info, known_answer_failure=failure)
        await load_lora_modules(client, settings.lora_module_sources, settings.max_loras)
        salts, kv = SaltBook(), None
        if settings.vllm_kv_events_endpoint:
            translator = KvTranslator(info.block_size, salts)
            kv = KvSubscriber(settings.vllm_kv_events_endpoint, translator)
            kv.start()
        engine_id = settings.engine_id or f"{settings.host}:{settings.port}"
        servicer = VllmEngineServicer(info, engine_id, client, tokenizer, kv, salts)
        servicer.draining = bool(info.known_answer_failure)
        handle = await start_server(
            "engine",
            settings,
            [GrpcService(SERVICE_NAME, servicer, engine_pb2_grpc.add_EngineServicer_to_server)],
        )
        if info.known_answer_failure:
            await stay_not_serving(handle, info.known_answer_failure)
        log.info("vllm_adapter_ready", vllm_url=settings.vllm_url, **info.__dict__)

        async def drain() -> None:
            servicer.draining = True

        await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=drain)
        if kv is not None:
            await kv.stop()
    finally:
        await client.aclose()


def main(settings: EngineSettings) -> None:
    event_loop.run(serve(settings))
