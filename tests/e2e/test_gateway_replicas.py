"""Two more gateway replicas beside the stack's own, sharing its Redis and router:
limits hold exactly across them, revocation reaches both, routes hot-reload."""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import grpc
import httpx
import pytest

from maas.v1 import gateway_pb2, gateway_pb2_grpc
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.gateway.admission.tenants import TenantStore
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow


class Replica:
    def __init__(self, stack, routes_file, index: int, flags: dict):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.grpc = f"127.0.0.1:{free_port()}"
        argv = serve_argv(
            "gateway",
            {
                "port": self.url.rsplit(":", 1)[1],
                "grpc-port": self.grpc.rsplit(":", 1)[1],
                "redis-url": stack.redis_urls["gateway"],
                "tokenizer-address": stack.addresses["tokenizer"],
                "router-address": stack.addresses["router"],
                "routes-file": routes_file,
                "routes-poll-seconds": 0.2,
                # A spool folder is owned by one live process.
                "usage-spool-dir": stack.config.state_dir / f"spool-replica-{index}",
                **flags,
            },
        )
        log = stack.config.state_dir / "logs" / f"gateway-replica-{index}.log"
        # Its calls to the stack's tokenizer and router carry the stack's token.
        env = {SERVICE_TOKEN_ENV: stack.service_token}
        self.process = ManagedProcess(f"gateway-replica-{index}", argv, log, env=env)


@pytest.fixture(scope="module")
def replicas(stack, tmp_path_factory):
    routes = tmp_path_factory.mktemp("routes") / "routes.yaml"
    started = [
        # The first one also filters a word out of what the model writes.
        Replica(stack, routes, 0, {"blocked-terms": ["Paris"]}),
        Replica(stack, routes, 1, {}),
    ]
    for replica in started:
        replica.process.start()
    try:

        async def ready():
            await asyncio.gather(*(wait_ready(r.process, f"{r.url}/readyz", 120) for r in started))

        asyncio.run(ready())
        yield started, routes
    finally:
        for replica in started:
            replica.process.stop(timeout=20)


def admin(stack, *args) -> dict:
    """`maas tenants|keys ...` as an operator runs it beside `maas up`: no flags."""
    env = {**os.environ, "MAAS_STATE_DIR": str(stack.config.state_dir)}
    env.pop("MAAS_REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "maas_tools.cli", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def new_tenant(stack, **limits) -> dict:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in limits.items()]
    return admin(stack, "tenants", "create", "--name", f"t-{uuid.uuid4().hex[:8]}", *flags)


def completion(max_tokens=1, **extra) -> dict:
    return {"model": DEFAULT_MODEL_ID, "prompt": "Hi", "max_tokens": max_tokens, **extra}


async def test_rpm_is_exact_across_two_replicas(stack, replicas):
    gateways, _ = replicas
    created = new_tenant(stack, rpm=10)
    headers = {"Authorization": f"Bearer {created['api_key']}"}
    async with httpx.AsyncClient(headers=headers, timeout=120) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{gateways[i % 2].url}/v1/completions", json=completion())
                for i in range(40)
            )
        )
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 10 and statuses.count(429) == 30, statuses
    for answer in answers:
        assert answer.headers["x-ratelimit-limit-requests"] == "10"
        assert "x-ratelimit-remaining-requests" in answer.headers
        assert "x-ratelimit-reset-requests" in answer.headers
        if answer.status_code == 429:
            assert int(answer.headers["Retry-After"]) >= 1
            assert answer.json()["error"]["code"] == "rate_limit_exceeded"


async def test_a_revoked_key_fails_within_one_second_on_every_replica(stack, replicas):
    gateways, _ = replicas
    created = new_tenant(stack)
    key = admin(stack, "keys", "create", "--tenant", created["tenant"]["name"])
    headers = {"Authorization": f"Bearer {key['api_key']}"}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        for gateway in gateways:
            assert (await client.get(f"{gateway.url}/v1/models")).status_code == 200
        redis = open_redis(stack.redis_url)
        try:
            revoked_at = time.monotonic()
            assert await TenantStore(redis).revoke_key(key["key_id"])
        finally:
            await redis.aclose()
        pending = set(range(len(gateways)))
        while pending and time.monotonic() - revoked_at < 2:
            for index in list(pending):
                if (await client.get(f"{gateways[index].url}/v1/models")).status_code == 401:
                    pending.discard(index)
            await asyncio.sleep(0.02)
        assert not pending and time.monotonic() - revoked_at < 1.0
    # The tenant's first key still works.
    other = {"Authorization": f"Bearer {created['api_key']}"}
    assert httpx.get(f"{gateways[1].url}/v1/models", headers=other).status_code == 200


def test_caps_and_allowed_models(stack, replicas):
    gateways, _ = replicas
    created = new_tenant(stack, max_tokens=4, models="only-this")
    headers = {"Authorization": f"Bearer {created['api_key']}"}
    url = f"{gateways[1].url}/v1/completions"
    assert httpx.post(url, json=completion(), headers=headers).status_code == 404
    admin(stack, "tenants", "update", "--name", created["tenant"]["name"], "--models", "")
    time.sleep(0.6)  # the key cache's TTL
    too_many = httpx.post(url, json=completion(max_tokens=5), headers=headers, timeout=60)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    fine = httpx.post(url, json=completion(max_tokens=4), headers=headers, timeout=60)
    assert fine.status_code == 200, fine.text


def test_routes_file_changes_take_effect_without_restart(stack, replicas):
    gateways, routes = replicas
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    routes.write_text(f"models:\n  smollm2:\n    routes: [{{deployment: {DEFAULT_MODEL_ID}}}]\n")
    deadline = time.monotonic() + 5
    for gateway in gateways:
        while time.monotonic() < deadline:
            listed = httpx.get(f"{gateway.url}/v1/models", headers=headers).json()
            if "smollm2" in [m["id"] for m in listed["data"]]:
                break
            time.sleep(0.1)
        reply = httpx.post(
            f"{gateway.url}/v1/completions",
            json=completion(model="smollm2"),
            headers=headers,
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "smollm2"


def test_blocked_terms_are_masked(stack, replicas):
    gateways, _ = replicas
    reply = httpx.post(
        f"{gateways[0].url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {stack.api_key}"},
        json={
            "model": DEFAULT_MODEL_ID,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 24,
            "stream": True,
        },
        timeout=60,
    )
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in reply.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert "Paris" not in text and "*****" in text, text


async def test_grpc_front_applies_the_same_limits(stack, replicas):
    gateways, _ = replicas
    created = new_tenant(stack, rpm=1)
    metadata = [("authorization", f"Bearer {created['api_key']}")]
    request = gateway_pb2.CompletionRequest(
        model=DEFAULT_MODEL_ID, prompt="Hi", options=gateway_pb2.CompletionOptions(max_tokens=1)
    )
    async with grpc.aio.insecure_channel(gateways[0].grpc) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        call = stub.Completion(request, metadata=metadata)
        chunks = [c async for c in call]
        assert chunks[-1].usage.completion_tokens == 1
        assert dict(await call.initial_metadata())["x-ratelimit-remaining-requests"] == "0"
        refused = stub.Completion(request, metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in refused:
                pass
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(caught.value.trailing_metadata())["retry-after"]) >= 1


async def test_a_stream_past_the_stop_grace_ends_with_an_error_event(stack, tmp_path):
    """A replica stopped (SIGTERM) while a long answer streams waits its grace period, then
    ends the stream with an error event and the body's end: the client reads a whole
    response, not a connection closed mid-chunk (http_stream.EventStream)."""
    replica = Replica(stack, tmp_path / "routes.yaml", 2, {"shutdown-grace-seconds": 1})
    replica.process.start()
    try:
        await wait_ready(replica.process, f"{replica.url}/readyz", 120)
        created = new_tenant(stack)
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        body = completion(max_tokens=2000, ignore_eos=True, stream=True)
        events: list[dict] = []
        url = f"{replica.url}/v1/completions"
        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as client,
            client.stream("POST", url, json=body) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 3:
                        replica.process.process.terminate()  # SIGTERM, mid-answer
        assert len(events) > 3 and all("choices" in e for e in events[:-1])
        assert events[-1]["error"]["code"] == "service_unavailable"
    finally:
        replica.process.stop(timeout=20)
