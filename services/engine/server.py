"""`maas serve engine`: load the model, then serve maas.v1.Engine."""

import asyncio
import time

import torch

from maas.v1 import engine_pb2, engine_pb2_grpc
from services.common.grpc_server import GrpcService, run_until_signalled, start_server
from services.common.logging import get_logger
from services.common.model_files import resolve_model_path
from services.common.tokenizer_loader import load_tokenizer
from services.engine.device import resolve_device, resolve_dtype
from services.engine.generator import Generator
from services.engine.loader import load_model
from services.engine.servicer import EngineServicer
from services.engine.settings import EngineSettings

log = get_logger(__name__)
SERVICE_NAME = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name


def build_servicer(settings: EngineSettings) -> EngineServicer:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    path = resolve_model_path(settings.model_path)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    started = time.perf_counter()
    model, config = load_model(path, dtype=dtype, device=device, progress=True)
    tokenizer = load_tokenizer(path)
    max_model_len = min(settings.max_model_len or config.max_model_len, config.max_model_len)
    log.info(
        "model_loaded",
        path=str(path),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=max_model_len,
        seconds=round(time.perf_counter() - started, 2),
    )
    generator = Generator(model, config, device=device)
    return EngineServicer(settings.model_id, generator, tokenizer, max_model_len, config.vocab_size)


async def serve(settings: EngineSettings) -> None:
    servicer = await asyncio.to_thread(build_servicer, settings)
    handle = await start_server(
        "engine",
        settings,
        [GrpcService(SERVICE_NAME, servicer, engine_pb2_grpc.add_EngineServicer_to_server)],
    )

    async def drain() -> None:
        servicer.draining = True

    await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=drain)


def main(settings: EngineSettings) -> None:
    asyncio.run(serve(settings))
