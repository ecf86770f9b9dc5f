"""`maas serve router`."""

import asyncio

from maas.v1 import router_pb2, router_pb2_grpc
from services.common.grpc_server import GrpcService, run_until_signalled, start_server
from services.router.endpoints import parse_static
from services.router.pool import EnginePool
from services.router.servicer import RouterServicer
from services.router.settings import RouterSettings

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


async def serve(settings: RouterSettings) -> None:
    pool = EnginePool(parse_static(settings.engines), settings.poll_interval_seconds)
    await pool.poll_once()
    pool.start()
    handle = await start_server(
        "router",
        settings,
        [
            GrpcService(
                SERVICE_NAME, RouterServicer(pool), router_pb2_grpc.add_RouterServicer_to_server
            )
        ],
    )
    await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=pool.close)


def main(settings: RouterSettings) -> None:
    asyncio.run(serve(settings))
