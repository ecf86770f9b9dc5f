"""Liveness (/healthz, /health) and readiness (/readyz) probes."""

import grpc
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.http_api.routes.deps import GatewayDep

log = get_logger(__name__)
router = APIRouter()


def not_ready(reason: str) -> JSONResponse:
    # Anyone can call the probe: the reason (Redis or gRPC errors, hosts) is for the log.
    log.warning("not_ready", reason=reason)
    return JSONResponse({"status": "not ready"}, status_code=503)


@router.get("/healthz")
@router.get("/health")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gw: GatewayDep):
    try:
        await gw.redis.ping()
        models = await gw.pipeline.models()
    except (RedisError, APIError, grpc.aio.AioRpcError) as exc:
        return not_ready(str(exc))
    if not models:
        return not_ready("no models")
    return {"status": "ready"}
