"""Trust between the services of a local stack, as `maas up` starts it.

A caller without the stack's service token (any other process on the host, a
pod of another tenant on a cluster) gets UNAUTHENTICATED from every internal
gRPC server, while health answers it; Redis refuses it without the password;
the files holding those secrets are the owner's alone, and no secret is on a
command line.
"""

from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.exceptions import AuthenticationError

from maas.v1 import (
    billing_pb2,
    billing_pb2_grpc,
    engine_pb2,
    engine_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from maas_services.common.redis_acl import USER_NAMES
from maas_services.common.redis_client import open_redis
from maas_tools.local.dev_tenant import KEY_FILE

pytestmark = pytest.mark.slow

REDIS_PASSWORDS = [f"redis-password-{user}" for user in USER_NAMES]
SECRET_FILES = [KEY_FILE, "service-token", *REDIS_PASSWORDS, "stack.json", "redis/users.acl"]


def free_calls(channel: grpc.aio.Channel, name: str) -> list:
    """What an intruder would do with each service: mint tokens, bill, generate, drain."""
    if name == "tokenizer":
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        return [stub.Encode(tokenizer_pb2.EncodeRequest(text="hi"))]
    if name == "billing":
        stub = billing_pb2_grpc.BillingStub(channel)
        return [stub.GetUsage(billing_pb2.GetUsageRequest(tenant="dev"))]
    engine = engine_pb2_grpc.EngineStub(channel)
    generate = engine_pb2.GenerateRequest(request_id="free", prompt_token_ids=[1, 2, 3])
    return [engine.Generate(generate), engine.Drain(engine_pb2.DrainRequest())]


@pytest.mark.parametrize("name", ["tokenizer", "engine-0", "billing", "router"])
async def test_internal_grpc_refuses_a_caller_without_the_token(stack, name):
    async with grpc.aio.insecure_channel(stack.addresses[name]) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        if name == "router":
            return  # its calls are covered in tests/integration/router/test_service_token.py
        for call in free_calls(channel, name):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                if isinstance(call, grpc.aio.UnaryStreamCall):
                    [_ async for _ in call]
                else:
                    await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_redis_refuses_a_client_without_the_password(stack):
    with_password = open_redis(stack.redis_urls["probe"])
    anonymous = aioredis.Redis(
        host=with_password.connection_pool.connection_kwargs["host"],
        port=with_password.connection_pool.connection_kwargs["port"],
        retry=None,  # redis-py's default retries a refused login for seconds
    )
    try:
        assert await with_password.ping()
        with pytest.raises(AuthenticationError):
            await anonymous.get("tenant:dev")
    finally:
        await anonymous.aclose()
        await with_password.aclose()


def test_secret_files_are_the_owners_alone(stack):
    for name in SECRET_FILES:
        mode = (stack.config.state_dir / name).stat().st_mode & 0o777
        assert mode == 0o600, f"{name}: {oct(mode)}"


def test_no_secret_on_a_command_line(stack):
    passwords = [(stack.config.state_dir / f).read_text().strip() for f in REDIS_PASSWORDS]
    for process in stack.processes:
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
        assert stack.service_token not in cmdline, process.name
        assert not any(p in cmdline for p in passwords), process.name


def test_each_child_gets_only_its_own_redis_user(stack):
    passwords = {
        u: (stack.config.state_dir / f"redis-password-{u}").read_text().strip() for u in USER_NAMES
    }
    for process in stack.processes:
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().decode()
        given = {user for user, password in passwords.items() if password in environ}
        assert given == ({process.name} & {"gateway", "billing"}), process.name
