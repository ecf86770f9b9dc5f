"""GetLoad's answer from a server process that never reports SERVING (a failed
known-answer check keeps it not ready), once it is up."""

import asyncio

import grpc

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_tools.local.processes import ManagedProcess


async def load_when_up(
    address: str, process: ManagedProcess, attempts: int
) -> engine_pb2.LoadReport:
    """GetLoad's answer once the server at address answers; fails fast if process exits."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for _ in range(attempts):
            assert process.exited() is None, process.log_tail()
            try:
                return await stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=5)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
    raise AssertionError(f"no GetLoad answer; log:\n{process.log_tail()}")
