"""The front on uvicorn, in the engine's event loop; services/engine/server.py starts it.

Signals stay the engine server's (run_until_signalled): uvicorn would take
SIGTERM for itself and close this front before the gRPC health says
NOT_SERVING. On the way down the front stops taking connections and gives
the streams it carries the engine's shutdown grace, as the gRPC server does.
"""

import asyncio
import contextlib
from dataclasses import dataclass

import uvicorn

from maas_services.common.logging import get_logger
from maas_services.common.service_token import service_token
from maas_services.engine.http_front.app import BodyLimits, create_app
from maas_services.engine.http_front.completion import EngineFront
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)


@dataclass
class HttpFront:
    server: uvicorn.Server
    task: asyncio.Task

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def start_http_front(settings: EngineSettings, front: EngineFront) -> HttpFront:
    """Serve the front on settings.http_port; SystemExit if it cannot listen there."""
    limits = BodyLimits(settings.http_max_body_bytes, settings.http_body_timeout_seconds)
    config = uvicorn.Config(
        create_app(front, limits, service_token()),
        host=settings.host,
        port=settings.http_port,
        log_config=None,
        # No route speaks WebSocket: an Upgrade header must not switch protocols.
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            # uvicorn logged why (the port taken, most often) and exits.
            log.error("http_front_failed_to_start", port=settings.http_port)
            raise SystemExit(1)
        await asyncio.sleep(0.05)
    log.info("http_front_started", port=settings.http_port)
    return HttpFront(server, task)
