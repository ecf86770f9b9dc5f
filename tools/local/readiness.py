"""Waiting for children to become ready, failing fast when one dies."""

import asyncio
import time

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.exceptions import RedisError

from maas_services.common.redis_client import open_redis
from maas_tools.local.processes import ManagedProcess


class StartupError(RuntimeError):
    pass


async def _grpc_serving(probe: str) -> bool:
    address, _, service = probe.partition("/")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def _http_ready(url: str) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        try:
            return (await client.get(url)).status_code == 200
        except httpx.HTTPError:
            return False


async def _redis_ready(url: str) -> bool:
    redis = open_redis(url)
    try:
        return await redis.ping()
    except RedisError:
        return False
    finally:
        await redis.aclose()


async def wait_ready(process: ManagedProcess, probe: str, timeout: float) -> None:
    """Poll `probe` until ready: an http:// or redis:// URL, or gRPC health at
    HOST:PORT (the server's overall health) or HOST:PORT/SERVICE (a health name)."""
    if probe.startswith("http"):
        check = _http_ready
    elif probe.startswith("redis"):
        check = _redis_ready
    else:
        check = _grpc_serving
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = process.exited()
        if code is not None:
            raise StartupError(
                f"{process.name} exited with code {code}; last log lines:\n{process.log_tail()}"
            )
        if await check(probe):
            return
        await asyncio.sleep(0.2)
    raise StartupError(
        f"{process.name} not ready after {timeout:.0f}s; last lines of {process.log_path}:\n"
        f"{process.log_tail()}"
    )
