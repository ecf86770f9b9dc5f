"""A served engine passes its start-up known-answer check, or stays not ready and says why.

The wrong engine is the bundled model's folder with noise in every weight,
started with the right model's float32 reference (as a ModelDeployment gives
one): weights damaged on their way to a node. Both engines start at once.
"""

import asyncio
import shutil

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.torch import load_file, save_file

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.engine.known_answer_reference import reference
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.peers.model_folder import hf_model_folder
from tests.integration import load_report
from tests.integration.engine.test_engine_server import request

pytestmark = pytest.mark.slow


def wrong_model_folder(target):
    """A copy of the bundled model's folder with noise of a tenth of each weight's spread."""
    source = hf_model_folder(None)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("known-answer.json"))
    noise = torch.Generator().manual_seed(0)
    for shard in target.glob("*.safetensors"):
        weights = load_file(shard)
        for weight in weights.values():
            weight.add_(torch.randn(weight.shape, generator=noise) * 0.1 * weight.float().std())
        save_file(weights, shard, metadata={"format": "pt"})
    return target


def engine_process(log_path, **flags) -> tuple[ManagedProcess, str]:
    port = free_port()
    flags |= {"port": port, "metrics-port": free_port(), "dtype": "float32"}
    flags["kv-cache-memory"] = 64 * 1024**2
    return ManagedProcess("engine", serve_argv("engine", flags), log_path), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def engines(smollm_path, tmp_path_factory):
    folder = wrong_model_folder(tmp_path_factory.mktemp("wrong") / "model")
    right = engine_process(tmp_path_factory.mktemp("right") / "engine.log")
    wrong = engine_process(
        tmp_path_factory.mktemp("wrong-log") / "engine.log",
        **{"model-path": folder, "known-answer": reference("cache", smollm_path)},
    )
    for process, _ in (right, wrong):
        process.start()
    asyncio.run(wait_ready(*right, timeout=300))
    yield right, wrong
    for process, _ in (right, wrong):
        process.stop(timeout=30)


async def load_when_up(address: str, process: ManagedProcess) -> engine_pb2.LoadReport:
    """GetLoad's answer once the server is up (it never reports SERVING)."""
    return await load_report.load_when_up(address, process, attempts=3000)


async def test_a_right_engine_passes_and_serves(engines):
    (process, address), _ = engines
    assert "known_answer_passed" in process.log_path.read_text()
    load = await load_when_up(address, process)
    assert not load.draining and load.not_ready_reason == ""


async def test_a_wrong_engine_stays_not_ready_and_says_why(engines):
    _, (process, address) = engines
    load = await load_when_up(address, process)
    assert load.draining
    assert "off the float32 reference" in load.not_ready_reason
    async with grpc.aio.insecure_channel(address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await engine_pb2_grpc.EngineStub(channel).Generate(request("r", 4)).read()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    log = process.log_path.read_text()
    assert "known_answer_failed" in log and "engine_not_ready" in log
    assert process.exited() is None  # it runs, so its reason can be read
