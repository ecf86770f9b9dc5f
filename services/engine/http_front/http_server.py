"""The front on uvicorn, in the engine's event loop; services/engine/server.py starts it.

Signals stay the engine server's (run_until_signalled): uvicorn would take
SIGTERM for itself and close this front before the gRPC health says
NOT_SERVING. On the way down the front keeps listening while the requests it
carries finish, within the engine's shutdown grace, answering anything new
with 503 "engine is draining" (an endpoint picker or gateway still sending
before the pod leaves its endpoints then gets an answer it can retry
elsewhere, not a refused connection); then it stops listening, and what is
still running has what is left of the grace, as on the gRPC server.
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


# How often a draining front looks whether its requests have finished.
DRAIN_POLL_SECONDS = 0.05


@dataclass
class HttpFront:
    server: uvicorn.Server
    task: asyncio.Task
    grace_seconds: float

    async def stop(self) -> None:
        """Called once the front answers new requests 503 (the servicer drains)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_seconds
        # uvicorn's running request cycles; a 503 is one only for a moment.
        while self.server.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        # uvicorn then waits this long for what still runs, and cancels it: what
        # is left of the one grace, not a second one.
        self.server.config.timeout_graceful_shutdown = max(0.0, deadline - loop.time())
        self.server.should_exit = True
        await self.task


async def start_http_front(settings: EngineSettings, front: EngineFront) -> HttpFront:
    """Serve the front on settings.http_port; SystemExit if it cannot listen there."""
    limits = BodyLimits(settings.http_max_body_bytes, settings.http_body_timeout_seconds)
    config = uvicorn.Config(
        create_app(front, limits, service_token(), settings.served),
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
    return HttpFront(server, task, settings.shutdown_grace_seconds)
