"""`maas serve engine` keeps each tenant's prefix cache its own unless told to share."""

import asyncio
import itertools

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow

BLOCK = 16
_prompts = itertools.count(1000, 100)


def fresh_prompt() -> list[int]:
    """Three full blocks and a tail no other test has sent."""
    start = next(_prompts)
    return list(range(start, start + 3 * BLOCK + 5))


def engine_process(tmp_path_factory, sharing: str):
    port = free_port()
    flags = {
        "port": port,
        "metrics-port": free_port(),
        "dtype": "float32",
        "max-num-seqs": 2,
        "block-size": BLOCK,
        "prefix-cache-sharing": sharing,
    }
    process = ManagedProcess(
        "engine", serve_argv("engine", flags), tmp_path_factory.mktemp(sharing) / "engine.log"
    )
    process.start()
    address = f"127.0.0.1:{port}"
    asyncio.run(wait_ready(process, address, timeout=300))
    return process, address


@pytest.fixture(scope="module")
def isolating(tmp_path_factory):
    process, address = engine_process(tmp_path_factory, "tenant")
    yield address
    process.stop(timeout=30)


@pytest.fixture(scope="module")
def sharing(tmp_path_factory):
    process, address = engine_process(tmp_path_factory, "global")
    yield address
    process.stop(timeout=30)


class Client:
    def __init__(self, address: str):
        self._channel = grpc.aio.insecure_channel(address)
        self.stub = engine_pb2_grpc.EngineStub(self._channel)
        self._ids = itertools.count()

    async def cached(self, prompt: list[int], tenant: str = "", share: bool = False) -> int:
        """The prompt tokens this request was served from the prefix cache."""
        request = engine_pb2.GenerateRequest(
            request_id=f"r{next(self._ids)}",
            prompt_token_ids=prompt,
            sampling=engine_pb2.SamplingParams(max_tokens=1),
            tenant=tenant,
            share_prefix_cache=share,
        )
        responses = [r async for r in self.stub.Generate(request)]
        return responses[-1].usage.cached_prompt_tokens

    async def close(self) -> None:
        await self._channel.close()


@pytest.fixture
async def isolated_client(isolating):
    client = Client(isolating)
    yield client
    await client.close()


@pytest.fixture
async def sharing_client(sharing):
    client = Client(sharing)
    yield client
    await client.close()


async def test_a_tenant_hits_its_own_prefix_and_never_another_tenants(isolated_client):
    client, prompt = isolated_client, fresh_prompt()
    assert await client.cached(prompt, tenant="a") == 0
    assert await client.cached(prompt, tenant="a") == 3 * BLOCK
    assert await client.cached(prompt, tenant="b") == 0
    # Asking to share changes nothing on an engine that does not share.
    assert await client.cached(prompt, tenant="c", share=True) == 0
    # Nor is a request without a tenant anyone's guest.
    assert await client.cached(prompt) == 0
    load = await client.stub.GetLoad(engine_pb2.GetLoadRequest())
    assert load.prefix_cache_sharing == "tenant"


async def test_a_sharing_engine_pools_the_requests_that_ask(sharing_client):
    client, prompt = sharing_client, fresh_prompt()
    assert await client.cached(prompt, tenant="a", share=True) == 0
    assert await client.cached(prompt, tenant="b", share=True) == 3 * BLOCK
    # Those that don't ask keep their own.
    assert await client.cached(prompt, tenant="c") == 0
    assert await client.cached(prompt, tenant="c") == 3 * BLOCK
    assert await client.cached(prompt, tenant="a") == 0
    load = await client.stub.GetLoad(engine_pb2.GetLoadRequest())
    assert load.prefix_cache_sharing == "global"
