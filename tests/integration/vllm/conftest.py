"""One real vLLM server (CPU build) for this package's tests, and the adapter in front of it.

vLLM's python comes from maas_tools.peers (MAAS_VLLM_PYTHON, else the cached
venv). Without one the tests skip, unless MAAS_REQUIRE_VLLM is set (CI sets it
and installs vLLM first): then the venv is built, and a failure fails.
"""

import asyncio
import os
import secrets

import grpc
import httpx
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.engine.vllm_backend.load import parse_metrics
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.peers.model_folder import hf_model_folder
from maas_tools.peers.venv import VLLM, ensure, installed
from maas_tools.peers.vllm_server import VllmConfig, VllmServer

SERVED_MODEL = "smollm2-vllm"
MODEL_ID = "smollm2-via-vllm"  # what our clients call it: not vLLM's name
BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32
MAX_NUM_SEQS = 8
API_KEY = secrets.token_urlsafe(24)
# SmolLM2's chat template around "What is 2+2?", its default system prompt
# included: 37 tokens, one full block of 32 and a partial one.
PROMPT = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
    407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2,
    198, 1, 520, 9531, 198,
]  # fmt: skip


@pytest.fixture(scope="session")
def vllm_python():
    if os.environ.get("MAAS_REQUIRE_VLLM"):
        return ensure(VLLM)
    python = installed(VLLM)
    if python is None:
        pytest.skip("vLLM is not installed (make install-vllm, or MAAS_VLLM_PYTHON)")
    return python


# Package scope: the server (~3 GiB) stops after the package's last test, not
# at the end of the worker's session.
def vllm_config(vllm_python, *extra_args: str) -> VllmConfig:
    """The tests' vLLM: float32, eager, one GiB of KV cache, the tests' block size."""
    return VllmConfig(
        python=vllm_python,
        model=hf_model_folder(None),
        served_model_name=SERVED_MODEL,
        kv_events_port=0,
        kv_cache_gib=1,
        enforce_eager=True,
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=MAX_NUM_SEQS,
        extra_args=["--block-size", str(BLOCK_SIZE), *extra_args],
        # As the operator and `maas up` run it: only the adapter, given the key, may call it.
        api_key=API_KEY,
    )


@pytest.fixture(scope="package")
def vllm_server(vllm_python, tmp_path_factory):
    config = vllm_config(vllm_python)
    server = VllmServer(config, tmp_path_factory.mktemp("vllm") / "vllm.log").start()
    yield server
    server.stop()


def adapter_process(vllm_server, log_dir, **flags) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = serve_argv(
        "engine",
        {
            "backend": "vllm",
            "vllm-url": vllm_server.url,
            "vllm-kv-events-endpoint": vllm_server.config.kv_events_endpoint,
            "model-id": MODEL_ID,
            "max-num-seqs": MAX_NUM_SEQS,
            "port": port,
            "metrics-port": free_port(),
            **flags,
        },
    )
    env = {"VLLM_API_KEY": vllm_server.config.api_key}
    process = ManagedProcess("vllm-adapter", argv, log_dir / "adapter.log", env=env)
    return process, f"127.0.0.1:{port}"


@pytest.fixture(scope="package")
def adapter(vllm_server, tmp_path_factory) -> str:
    """`maas serve engine --backend vllm` as a process; its gRPC address."""
    process, address = adapter_process(vllm_server, tmp_path_factory.mktemp("adapter"))
    process.start()
    asyncio.run(wait_ready(process, address, timeout=120))
    yield address
    process.stop(timeout=30)


@pytest.fixture
async def stub(adapter):
    async with grpc.aio.insecure_channel(adapter) as channel:
        yield engine_pb2_grpc.EngineStub(channel)


@pytest.fixture
async def vllm_http(vllm_server):
    headers = {"Authorization": f"Bearer {vllm_server.config.api_key}"}
    async with httpx.AsyncClient(base_url=vllm_server.url, headers=headers, timeout=120) as client:
        yield client


def generate_request(request_id: str, prompt=PROMPT, tenant="t", **sampling):
    return engine_pb2.GenerateRequest(
        request_id=request_id,
        model=MODEL_ID,
        prompt_token_ids=prompt,
        tenant=tenant,
        sampling=engine_pb2.SamplingParams(**sampling),
    )


async def vllm_running(client: httpx.AsyncClient) -> int:
    return parse_metrics((await client.get("/metrics")).text).running
