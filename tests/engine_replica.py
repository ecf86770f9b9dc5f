"""A real engine process on fixed ports that a test or benchmark kills with
SIGKILL and starts again on the same address (the migration tests and
benchmarks/migration_bench.py)."""

import os
import signal
from pathlib import Path

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready


class EngineReplica:
    def __init__(self, name: str, log_dir: Path, flags: dict):
        """`flags` are `maas serve engine`'s, ports aside."""
        self.name, self.port = name, free_port()
        argv = serve_argv("engine", {"port": self.port, "metrics-port": free_port(), **flags})
        self.process = ManagedProcess(name, argv, log_dir / f"{name}.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, timeout: float = 600) -> None:
        self.process.start()
        await wait_ready(self.process, self.address, timeout=timeout)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)

    @property
    def alive(self) -> bool:
        return self.process.pid is not None and self.process.exited() is None

    async def running(self) -> int:
        """Its running requests; -1 when it does not answer."""
        try:
            async with open_channel(self.address, "test") as channel:
                report = await engine_pb2_grpc.EngineStub(channel).GetLoad(
                    engine_pb2.GetLoadRequest(), timeout=2
                )
                return report.running
        except Exception:
            return -1
