"""`maas serve router`."""

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common import event_loop
from maas_services.common.grpc_server import (
    GrpcService,
    ServerHandle,
    run_until_signalled,
    start_server,
)
from maas_services.router.discovery import make_source
from maas_services.router.plugin import PluginDeps
from maas_services.router.pool import EnginePool
from maas_services.router.scheduler import Scheduler
from maas_services.router.servicer import RouterServicer
from maas_services.router.settings import RouterSettings

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


async def start(settings: RouterSettings) -> tuple[ServerHandle, EnginePool]:
    """A serving router; the caller stops the server and closes the pool."""
    pool = EnginePool(make_source(settings), settings)
    # Built before anything connects: a bad policy or weight fails at startup.
    scheduler = Scheduler(PluginDeps(pool.index, pool.history, settings))
    await pool.start()
    servicer = RouterServicer(pool, scheduler)
    handle = await start_server(
        "router",
        settings,
        [GrpcService(SERVICE_NAME, servicer, router_pb2_grpc.add_RouterServicer_to_server)],
    )
    return handle, pool


async def serve(settings: RouterSettings) -> None:
    handle, pool = await start(settings)
    await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=pool.close)


def main(settings: RouterSettings) -> None:
    event_loop.run(serve(settings))
