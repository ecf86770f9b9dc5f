"""The engine core as its own process: what happens when either process dies.

Each test kills a process, so each gets a worker of its own; both start at
once (module fixture), with a small KV cache, to keep the start-up cost one.
"""

import asyncio
import signal

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from maas.v1 import engine_pb2_grpc
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from tests.integration.engine.test_engine_server import request

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def worker(path) -> tuple[ManagedProcess, str]:
    port = free_port()
    flags = {"port": port, "metrics-port": free_port(), "dtype": "float32"}
    flags["kv-cache-memory"] = 64 * 1024**2
    return ManagedProcess("engine", serve_argv("engine", flags), path), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    started = [worker(tmp_path_factory.mktemp("engine") / "engine.log") for _ in range(2)]
    for process, _ in started:
        process.start()

    async def ready():
        await asyncio.gather(*(wait_ready(p, a, timeout=300) for p, a in started))

    asyncio.run(ready())
    yield started
    for process, _ in started:
        process.stop(timeout=30)


def core_of(process: ManagedProcess) -> psutil.Process:
    (core,) = psutil.Process(process.pid).children()
    assert "maas_services.engine.core.process" in core.cmdline()
    return core


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_core_killed_mid_stream_ends_it_unavailable_and_the_worker_exits(workers):
    process, address = workers[0]
    core = core_of(process)
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await health.read()).status == SERVING
        stream = engine_pb2_grpc.EngineStub(channel).Generate(request("doomed", 1000))
        await stream.read()
        core.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            while await stream.read() != grpc.aio.EOF:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "engine core exited with code -9" in caught.value.details()
        assert (await health.read()).status == NOT_SERVING
    assert await asyncio.to_thread(process.process.wait, 60) == 1


async def test_worker_killed_takes_its_core_with_it(workers):
    process, _ = workers[1]
    core = core_of(process)
    process.process.send_signal(signal.SIGKILL)
    assert await asyncio.to_thread(process.process.wait, 30) == -signal.SIGKILL
    # Bounded only so that an orphan fails the test instead of hanging it.
    for _ in range(300):
        if gone(core):
            break
        await asyncio.sleep(0.1)
    assert gone(core)
