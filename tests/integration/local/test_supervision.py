"""A supervised local stack (as `maas up` runs it) outlives a `kill -9` of billing.

A stack of its own: the session stack is shared, and these tests kill its
children. The second test ends the stack (billing can no longer start), so it
runs last.
"""

import asyncio
import json
import os
import signal
import socket

import openai
import pytest

from maas_services.billing.ledger import Ledger
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig
from maas_tools.local.supervisor import CrashLoop, RestartPolicy
from tests.e2e.tenants import new_tenant_key
from tests.integration.router.conftest import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ENGINE_ARGS = ["--max-model-len", "256", "--kv-cache-memory", "8000000", "--torch-threads", "1"]
STREAM_TOKENS = 24


@pytest.fixture(scope="module")
def supervised(tmp_path_factory):
    config = StackConfig(
        state_dir=tmp_path_factory.mktemp("supervised"),
        gateway_port=free_port(),
        engine_args=ENGINE_ARGS,
        startup_timeout=240,
        restart=RestartPolicy(initial_backoff=0.2, max_start_failures=3),
    )
    stack = Stack(config)
    try:
        asyncio.run(stack.start())
        yield stack
    finally:
        stack.stop()


def child(stack: Stack, name: str):
    return next(p for p in stack.processes if p.name == name)


def kill_billing(stack: Stack) -> None:
    billing = child(stack, "billing")
    os.kill(billing.pid, signal.SIGKILL)
    billing.process.wait()  # reaped here, so its port is free when this returns


async def caught_up(redis) -> bool:
    """Billing has read and acknowledged every usage event in the stream."""
    (group,) = await redis.xinfo_groups(USAGE_STREAM)
    newest = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
    return group["pending"] == 0 and group["last-delivered-id"] == newest


async def test_killed_billing_restarts_while_a_stream_completes_and_bills_once(supervised):
    stack = supervised
    tenant, key = await new_tenant_key(stack.redis_url, "supervised")
    client = openai.AsyncOpenAI(
        base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0, timeout=120
    )
    others = {p.name: p.pid for p in stack.processes if p.name != "billing"}
    redis = open_redis(stack.redis_url)
    ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable())
    supervising = asyncio.create_task(stack.supervise())
    try:
        # Billed by the first billing process before it dies.
        first = await client.completions.create(model=DEFAULT_MODEL_ID, prompt="Hi", max_tokens=3)

        async def first_billed() -> bool:
            return (await ledger.totals(tenant))[0].requests == 1

        await eventually(first_billed, timeout=60, what="the first request billed")
        before = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]

        stream = await client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [await anext(aiter(stream))]
        kill_billing(stack)
        chunks += [chunk async for chunk in stream]

        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        usage = chunks[-1].usage
        assert usage.completion_tokens == STREAM_TOKENS

        await eventually(
            lambda: child(stack, "billing").restarts == 1, timeout=60, what="a restart"
        )

        # The gateway writes usage after the response's last byte, so the client
        # can be done before the event exists: wait for it, then for billing.
        async def stream_event_written() -> bool:
            return (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"] != before

        await eventually(stream_event_written, timeout=30, what="the stream's usage event")
        await eventually(lambda: caught_up(redis), timeout=120, what="billing caught up")
        totals, _ = await ledger.totals(tenant)
        # Exactly once: the event billed before the kill is not billed again by
        # the restarted consumer, and the one written while billing was down is.
        assert totals.requests == 2
        assert totals.total_tokens == first.usage.total_tokens + usage.total_tokens
        assert {p.name: p.pid for p in stack.processes if p.name != "billing"} == others
        state = json.loads((stack.config.state_dir / "stack.json").read_text())
        assert state["restarts"]["billing"] == 1
        assert state["pids"]["billing"] == child(stack, "billing").pid
        # Restarted billing was checked by its liveness (test_billing_restart_probe.py: why).
        assert child(stack, "billing").restart_probe == f"{stack.addresses['billing']}/liveness"
        assert not supervising.done()
    finally:
        supervising.cancel()
        await redis.aclose()


async def test_billing_that_keeps_dying_at_start_ends_supervision_with_its_error(supervised):
    stack = supervised
    supervising = asyncio.create_task(stack.supervise())
    # Whatever holds billing's port when it comes back makes every start fail.
    squatter = socket.socket()
    # The killed billing's connections may linger in TIME_WAIT on its port.
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        kill_billing(stack)
        host, port = stack.addresses["billing"].rsplit(":", 1)
        squatter.bind((host, int(port)))
        squatter.listen()
        with pytest.raises(CrashLoop) as error:
            await supervising
    finally:
        supervising.cancel()
        squatter.close()
    message = str(error.value)
    assert message.startswith("billing keeps dying at start (3 restarts in a row failed)")
    assert f"Failed to bind to address {stack.addresses['billing']}" in message
    assert child(stack, "gateway").exited() is None
