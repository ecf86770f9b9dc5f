"""A replica killed mid-run, with real engines, router and gateway (local mode).

Engine-1 is frozen (SIGSTOP) so that requests picked for it are stuck before
their first token, then killed: the router takes it out at once, and the
gateway retries those requests on engine-0, so every one of them succeeds.
"""

import asyncio
import os
import signal

import httpx
import openai
import pytest

from maas.v1 import router_pb2, router_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig
from tests.integration.router.conftest import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ENGINE_ARGS = ["--max-model-len", "256", "--kv-cache-memory", "8000000", "--torch-threads", "1"]


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory):
    config = StackConfig(
        state_dir=tmp_path_factory.mktemp("failover"),
        gateway_port=free_port(),
        engine_replicas=2,
        engine_args=ENGINE_ARGS,
        routing_policy="least_load",
        startup_timeout=240,
    )
    stack = Stack(config)
    try:
        asyncio.run(stack.start())
        yield stack
    finally:
        stack.stop()


def finished_requests(stack: Stack, engine: str) -> float:
    text = httpx.get(stack.metrics_urls[engine], timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("maas_engine_requests_finished_total")
    )


async def test_requests_on_a_killed_replica_are_retried_elsewhere(two_engines):
    stack = two_engines
    engine_1 = next(p for p in stack.processes if p.name == "engine-1")
    client = openai.AsyncOpenAI(
        base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0, timeout=120
    )
    done_before = finished_requests(stack, "engine-0")

    os.kill(engine_1.pid, signal.SIGSTOP)  # alive to the kernel, silent to everyone
    requests = [
        asyncio.create_task(
            client.chat.completions.create(
                model=DEFAULT_MODEL_ID,
                messages=[{"role": "user", "content": f"Count to ten, take {i}."}],
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
        )
        for i in range(6)
    ]
    await asyncio.sleep(3)  # least_load has sent half of them to engine-1 by now
    os.kill(engine_1.pid, signal.SIGKILL)
    replies = await asyncio.gather(*requests)

    assert [r.usage.completion_tokens for r in replies] == [4] * 6
    # All six ran on engine-0: the ones picked for engine-1 were retried there.
    assert finished_requests(stack, "engine-0") - done_before == 6

    async with open_channel(stack.addresses["router"], "test", stack.service_token) as channel:
        router = router_pb2_grpc.RouterStub(channel)

        async def engine_1_out() -> bool:
            stats = await router.GetPoolStats(router_pb2.PoolStatsRequest())
            replicas = {r.endpoint_id: r.ready for r in stats.deployments[0].replicas}
            return replicas == {"engine-0": True, "engine-1": False}

        await eventually(engine_1_out, timeout=2.0, what="engine-1 out of the pool")
