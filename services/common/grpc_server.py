"""Run a grpc.aio server the same way in every service.

Each server gets the standard health service (so Kubernetes probes and
``maas up`` can wait for readiness), reflection (so grpcurl works), the metrics
and tracing interceptors, and a /metrics port. SIGTERM/SIGINT stop it
gracefully: health flips to NOT_SERVING, new calls are refused, in-flight
calls get ``shutdown_grace_seconds`` to finish, then the process exits.

Internal servers admit only callers with the release's service token
(maas_services.common.service_token; health and reflection stay open) and take
messages up to MESSAGE_LIMIT; a server that faces tenants passes
``internal=False`` (its servicer checks API keys) and its own ``receive_limit``
and ``max_concurrent_rpcs``, so an unauthenticated caller can neither make it
buffer 64 MiB nor hold an unbounded number of calls open (over the cap grpc
answers RESOURCE_EXHAUSTED before any handler runs).
"""

import asyncio
import math
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from maas_services.common.grpc_interceptors import ServerInterceptor
from maas_services.common.logging import get_logger
from maas_services.common.metrics import start_metrics_server
from maas_services.common.service_token import server_interceptors
from maas_services.common.settings import ServiceSettings

log = get_logger(__name__)

# Generation streams carry long prompts as token ids; allow 64 MiB messages.
MESSAGE_LIMIT = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
]

# A public server (internal=False) reads a call's message only when its
# handler asks, after the key check; until then grpc holds what the HTTP/2
# stream window lets the caller send: 64 KiB a call, with BDP probing off (it
# would grow the window towards megabytes on a fast link), and at most 100
# calls a connection. A read opens the window to the whole message. A
# connection must finish its HTTP/2 handshake within 10 s (as HTTP's headers
# must), and one with no call open for 60 s is closed (GOAWAY; a client
# reconnects on its next call).
PUBLIC_OPTIONS = [
    ("grpc.http2.lookahead_bytes", 64 * 1024),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.max_concurrent_streams", 100),
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 60_000),
]


@dataclass
class GrpcService:
    """One servicer and the generated function that registers it."""

    name: str  # fully qualified, e.g. "maas.v1.Engine"
    servicer: object
    add_to_server: Callable[[object, grpc.aio.Server], None]


@dataclass
class ServerHandle:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    metrics_port: int
    services: list[str] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.services):
            await self.health.set(name, status)


async def start_server(
    service: str,
    settings: ServiceSettings,
    services: Iterable[GrpcService],
    receive_limit: int = MESSAGE_LIMIT,
    max_concurrent_rpcs: int | None = None,
    internal: bool = True,
) -> ServerHandle:
    services = list(services)
    # Metrics outermost, so refused calls are counted as UNAUTHENTICATED.
    interceptors = [ServerInterceptor(service), *(server_interceptors() if internal else ())]
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", MESSAGE_LIMIT),
            ("grpc.max_receive_message_length", receive_limit),
            *(() if internal else PUBLIC_OPTIONS),
        ],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for svc in services:
        svc.add_to_server(svc.servicer, server)
    names = [svc.name for svc in services]
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    await server.start()
    metrics_port = start_metrics_server(settings.host, settings.metrics_port)
    handle = ServerHandle(server, health_servicer, port, metrics_port, names)
    await handle.set_serving(True)
    log.info("grpc_server_started", port=port, metrics_port=metrics_port, services=names)
    return handle


# How far past its grace a stopping process may run before the kernel ends it
# (arm_shutdown_watchdog).
SHUTDOWN_OVERRUN_SECONDS = 10


def arm_shutdown_watchdog(shutdown_seconds: float) -> None:
    """End this process (SIGALRM's default action) if it is still running
    SHUTDOWN_OVERRUN_SECONDS after the longest its shutdown may take (its grace, or
    more where it stops something of its own after the grace): by then it has
    nothing left to do. Kubernetes follows its SIGTERM with SIGKILL; a child of `maas up`
    whose parent was killed gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and no
    SIGKILL after it, so a cleanup that hangs (a task that never unwinds, a database
    driver's thread never stopped) would leave it running forever."""
    deadline = math.ceil(shutdown_seconds) + SHUTDOWN_OVERRUN_SECONDS
    signal.alarm(deadline)
    log.info("shutdown_watchdog_armed", exit_within_seconds=deadline)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_until_signalled(
    handle: ServerHandle,
    grace_seconds: float,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    shutdown_seconds: float | None = None,
) -> None:
    """Block until SIGTERM/SIGINT, then shut down gracefully; the process ends within
    shutdown_seconds (default: the grace) and SHUTDOWN_OVERRUN_SECONDS however its
    cleanup goes (arm_shutdown_watchdog)."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    await stop.wait()
    log.info("shutdown_started", grace_seconds=grace_seconds)
    arm_shutdown_watchdog(grace_seconds if shutdown_seconds is None else shutdown_seconds)
    await handle.set_serving(False)
    if on_stop is not None:
        await on_stop()
    await handle.server.stop(grace_seconds)
    log.info("shutdown_complete")
