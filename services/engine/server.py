"""`maas serve engine`: the engine core in its own process, maas.v1.Engine served here.

build_engine (load the model, size the KV cache) runs in the core process
(services/engine/core); serve() starts that process, waits for it to be
ready, and serves gRPC, the proto conversion and the metrics in this one,
and, when http_port is set, the OpenAI HTTP front (http_front/, docs/gie.md).
If the core dies, serve() reports NOT_SERVING and exits non-zero. If the core's
start-up known-answer check failed (services/engine/known_answer.py), the
server runs but stays NOT_SERVING, with the reason in its log and in GetLoad
(draining, not_ready_reason): kept up so the reason can be read, out of every
pick.
"""

import asyncio
import tempfile

from prometheus_client import REGISTRY

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common import event_loop
from maas_services.common.grpc_server import (
    GrpcService,
    ServerHandle,
    run_until_signalled,
    start_server,
)
from maas_services.common.logging import get_logger
from maas_services.common.model_files import resolve_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.async_engine import AsyncEngine, CoreDied
from maas_services.engine.core.addresses import CoreAddresses
from maas_services.engine.core.launcher import CoreProcess
from maas_services.engine.core.metrics_relay import RelayedMetrics
from maas_services.engine.http_front.completion import EngineFront
from maas_services.engine.http_front.http_server import HttpFront, start_http_front
from maas_services.engine.known_answer_gauge import KNOWN_ANSWER_FAILED
from maas_services.engine.model_server_metrics import ModelServerMetrics
from maas_services.engine.servicer import EngineServicer
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)
SERVICE_NAME = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name
CORE_DEATH_GRACE_SECONDS = 2.0


async def serve(settings: EngineSettings) -> None:
    relay = RelayedMetrics()
    REGISTRY.register(relay)
    with tempfile.TemporaryDirectory(prefix="maas-engine-") as directory:
        engine = AsyncEngine(CoreAddresses.under(directory), on_metrics=relay.update)
        # The series an InferencePool's endpoint picker reads (docs/gie.md).
        REGISTRY.register(ModelServerMetrics(engine, settings.model_id))
        core = await CoreProcess.start(settings, directory)
        try:
            await engine.start(core.wait())
        except CoreDied as exc:
            log.error("engine_core_failed_to_start", error=str(exc))
            raise SystemExit(1) from exc
        # After the core is ready: the model cache it filled makes this quick.
        tokenizer = await asyncio.to_thread(load_tokenizer, resolve_model_path(settings.model_path))
        engine_id = settings.engine_id or f"{settings.host}:{settings.port}"
        servicer = EngineServicer(settings.model_id, engine_id, engine, tokenizer, settings.served)
        not_ready = engine.info.known_answer_failure
        # Refuses every Generate (UNAVAILABLE); GetLoad says why.
        servicer.draining = bool(not_ready)
        # The OpenAI HTTP front (http_front/), through the same engine; up
        # before gRPC health says SERVING, so a ready pod serves both, and it
        # refuses new requests once the servicer drains.
        http: HttpFront | None = None
        if settings.http_port:
            front = EngineFront(settings.model_id, engine, tokenizer, lambda: servicer.draining)
            http = await start_http_front(settings, front)
        handle = await start_server(
            "engine",
            settings,
            [GrpcService(SERVICE_NAME, servicer, engine_pb2_grpc.add_EngineServicer_to_server)],
        )
        if not_ready:
            await stay_not_serving(handle, not_ready)
        http_stopped: list[asyncio.Task] = []

        async def drain() -> None:
            servicer.draining = True
            if http is not None:
                # Its streams' grace runs beside the gRPC server's, not after it.
                http_stopped.append(asyncio.create_task(http.stop()))

        signalled = asyncio.create_task(
            run_until_signalled(
                handle,
                settings.shutdown_grace_seconds,
                on_stop=drain,
                # The gRPC server's grace, then the core's to exit (core.stop below).
                shutdown_seconds=2 * settings.shutdown_grace_seconds,
            )
        )
        died = asyncio.create_task(engine.died.wait())
        await asyncio.wait({signalled, died}, return_when=asyncio.FIRST_COMPLETED)
        if not signalled.done():
            # Streams already ended with UNAVAILABLE; a short grace lets those
            # statuses reach their clients. Kubernetes restarts the pod.
            signalled.cancel()
            await handle.set_serving(False)
            await handle.server.stop(CORE_DEATH_GRACE_SECONDS)
            raise SystemExit(1)
        died.cancel()
        await asyncio.gather(*http_stopped)
        await engine.stop()
        await core.stop(settings.shutdown_grace_seconds)


async def stay_not_serving(handle: ServerHandle, reason: str) -> None:
    """Health NOT_SERVING for good. start_server has just set SERVING, and no await
    since has let the loop answer a health check in between."""
    await handle.set_serving(False)
    KNOWN_ANSWER_FAILED.set(1)
    log.error("engine_not_ready", reason=reason)


def main(settings: EngineSettings) -> None:
    event_loop.run(serve(settings))
