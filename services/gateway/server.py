"""`maas serve gateway`: the HTTP API (uvicorn) and the tenant gRPC API in one loop."""

import asyncio

import uvicorn

from maas.v1 import gateway_pb2, gateway_pb2_grpc
from services.common.grpc_server import GrpcService, install_stop_signals, start_server
from services.common.logging import get_logger
from services.common.redis_client import open_redis
from services.gateway.completions import CompletionService
from services.gateway.grpc_front import GatewayServicer
from services.gateway.http_app import create_app
from services.gateway.model_catalog import ModelCatalog
from services.gateway.settings import GatewaySettings
from services.gateway.tenants import TenantStore
from services.gateway.upstreams import Upstreams
from services.gateway.usage_emitter import UsageEmitter

log = get_logger(__name__)
SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


async def serve(settings: GatewaySettings) -> None:
    redis = open_redis(settings.redis_url)
    upstreams = Upstreams(settings.tokenizer_address, settings.router_address)
    service = CompletionService(
        upstreams,
        ModelCatalog(upstreams.router, settings.models_cache_seconds),
        UsageEmitter(redis),
        settings.request_timeout_seconds,
    )
    store = TenantStore(redis)
    grpc_settings = settings.model_copy(update={"port": settings.grpc_port})
    handle = await start_server(
        "gateway",
        grpc_settings,
        [
            GrpcService(
                SERVICE_NAME,
                GatewayServicer(service, store),
                gateway_pb2_grpc.add_GatewayServicer_to_server,
            )
        ],
    )
    config = uvicorn.Config(
        create_app(service, store, redis),
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
    )
    http = uvicorn.Server(config)
    # Signals are ours, not uvicorn's: one SIGTERM stops both fronts in order.
    http.install_signal_handlers = lambda: None
    http_task = asyncio.create_task(http.serve())
    stop = asyncio.Event()
    install_stop_signals(stop)
    await stop.wait()
    log.info("shutdown_started")
    await handle.set_serving(False)
    http.should_exit = True
    await asyncio.gather(http_task, handle.server.stop(settings.shutdown_grace_seconds))
    await service.wait_background()
    await upstreams.close()
    await redis.aclose()
    log.info("shutdown_complete")


def main(settings: GatewaySettings) -> None:
    asyncio.run(serve(settings))
