"""The adapter's start-up known-answer check against the package's real vLLM.

vLLM here computes the model rightly (float32, eager: right on every CPU,
services/common/vllm_cpu_mode.py), so the adapter passes against the float32
reference; told a reference its vLLM cannot meet (a ModelDeployment's wrong
number, standing in for a vLLM that computes wrongly) it stays not ready and
says why.
"""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_tools.local.readiness import wait_ready
from tests.integration import load_report
from tests.integration.vllm.conftest import adapter_process, generate_request


async def load_when_up(address, process) -> engine_pb2.LoadReport:
    return await load_report.load_when_up(address, process, attempts=1200)


@pytest.fixture(scope="module")
def adapters(vllm_server, tmp_path_factory):
    right = adapter_process(vllm_server, tmp_path_factory.mktemp("right"))
    wrong = adapter_process(vllm_server, tmp_path_factory.mktemp("wrong"), **{"known-answer": 3})
    for process, _ in (right, wrong):
        process.start()
    asyncio.run(wait_ready(*right, timeout=120))
    yield right, wrong
    for process, _ in (right, wrong):
        process.stop(timeout=30)


async def test_vllm_passes_against_the_float32_reference(adapters):
    (process, address), _ = adapters
    log = process.log_path.read_text()
    assert "known_answer_passed" in log and '"backend": "vllm"' in log
    load = await load_when_up(address, process)
    assert not load.draining and load.not_ready_reason == ""


async def test_a_vllm_off_its_reference_stays_not_ready_and_says_why(adapters):
    _, (process, address) = adapters
    load = await load_when_up(address, process)
    assert load.draining and "off the float32 reference 3.000" in load.not_ready_reason
    async with grpc.aio.insecure_channel(address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await engine_pb2_grpc.EngineStub(channel).Generate(generate_request("r")).read()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "known_answer_failed" in process.log_path.read_text()
