"""Request bytes a tenant can make the gateway hold: bounded per tenant and per replica.

The HTTP front runs on uvicorn with the gateway's protocol (server.http_server)
in the test's loop, over the stub cluster and real Redis, with a byte budget
small enough to fill with a few 1 MiB bodies. Clients are raw sockets, so a
body can stop half-sent and keep its reservation.
"""

import asyncio
import gc
import json
import uuid

import pytest
from starlette.requests import Request

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.server import http_server
from maas_services.gateway.settings import GatewaySettings
from tests.integration.gateway.conftest import MODEL

MiB = 1024 * 1024
# Long enough for any wait below on a loaded machine; a leak waits forever.
HANG_GUARD_SECONDS = 60


class Front:
    def __init__(self, cluster, port: int, budget: BodyBudget, store: TenantStore):
        self.cluster, self.port, self.budget, self.store = cluster, port, budget, store

    async def tenant(self, **limits) -> tuple[str, str]:
        """A new tenant: (its name, a key)."""
        tenant = await self.store.create_tenant(f"bb-{uuid.uuid4().hex[:8]}", **limits)
        return tenant.name, (await self.store.create_key(tenant.name))[1]


@pytest.fixture
async def front(make_cluster, redis_url):
    """front(**BudgetLimits) -> Front: the HTTP front with that byte budget."""
    running = []

    async def start(**limits) -> Front:
        cluster = await make_cluster(replicas=1, chunks=[f" t{i}" for i in range(4)])
        redis = open_redis(redis_url)
        store = TenantStore(redis)
        budget = BodyBudget(BudgetLimits(**{"body_bytes": MiB, "wait_seconds": 0.5, **limits}))
        gateway = Gateway(cluster.pipeline, Authenticator(store), redis, MiB, body_budget=budget)
        server = http_server(GatewaySettings(redis_url=redis_url, port=0), gateway)
        serving = asyncio.create_task(server.serve())
        running.append((server, serving, redis))
        while not server.started:
            assert not serving.done(), "the HTTP server did not start"
            await asyncio.sleep(0.01)
        return Front(cluster, server.servers[0].sockets[0].getsockname()[1], budget, store)

    yield start
    for server, serving, redis in running:
        server.should_exit = True
        await serving
        await redis.aclose()


def chat_body(size: int = 0, stream: bool = False) -> bytes:
    """A chat request padded with an unknown field to `size` bytes (the attack's shape)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": stream}
    plain = json.dumps(body).encode()
    if size <= len(plain):
        return plain
    body["padding"] = ""
    return json.dumps({**body, "padding": "x" * (size - len(json.dumps(body)))}).encode()


def head(key: str, length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {key}\r\n{framing}\r\n\r\n".encode()
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    return status, headers, await reader.read()  # a stream: up to the close


async def post(port: int, key: str, body: bytes, chunked: bool = False):
    """(status, headers, body) of one request on its own connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if chunked:
            writer.write(head(key, None))
            for start in range(0, len(body), 256 * 1024):
                part = body[start : start + 256 * 1024]
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(head(key, len(body)) + body)
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            return await read_response(reader)
    finally:
        writer.close()


async def half_sent(port: int, key: str, length: int = MiB):
    """A body that declares `length` bytes and sends a few: its reservation stays held."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(key, length) + b'{"model"')
    await writer.drain()
    return reader, writer


async def until(condition, what: str) -> None:
    async with asyncio.timeout(HANG_GUARD_SECONDS):
        while not condition():
            await asyncio.sleep(0.01)


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


async def test_a_tenant_over_its_share_waits_then_gets_429_while_another_is_served(front):
    gw = await front(total_bytes=16 * MiB, tenant_bytes=16 * MiB)
    attacker, attacker_key = await gw.tenant(max_concurrency=2)
    _, victim_key = await gw.tenant(max_concurrency=2)
    # max_concurrency 2 x 1 MiB bodies: two half-sent bodies fill the attacker's share.
    held = [await half_sent(gw.port, attacker_key) for _ in range(2)]
    await until(lambda: gw.budget.held_by(attacker) == 2 * MiB, "both reservations")

    status, headers, body = await post(gw.port, attacker_key, chat_body(MiB // 2))
    assert status == 429 and error_code(body) == "body_budget_exceeded"
    assert headers["retry-after"] == "1"
    status, _, _ = await post(gw.port, victim_key, chat_body(MiB // 2))
    assert status == 200

    for _, writer in held:
        writer.close()
    await until(lambda: gw.budget.held == 0, "the half-sent bodies given back")
    status, _, _ = await post(gw.port, attacker_key, chat_body(MiB // 2))
    assert status == 200


async def test_over_the_replica_total_a_read_waits_then_gets_503(front):
    gw = await front(total_bytes=3 * MiB, tenant_bytes=2 * MiB)
    _, first_key = await gw.tenant()
    _, second_key = await gw.tenant()
    _, third_key = await gw.tenant()
    held = [await half_sent(gw.port, first_key) for _ in range(2)]
    held.append(await half_sent(gw.port, second_key))
    await until(lambda: gw.budget.held == 3 * MiB, "the replica's whole budget")

    status, headers, body = await post(gw.port, third_key, chat_body())
    assert status == 503 and error_code(body) == "service_unavailable"
    assert "retry-after" in headers
    for _, writer in held:
        writer.close()
    await until(lambda: gw.budget.held == 0, "the half-sent bodies given back")
    status, _, _ = await post(gw.port, third_key, chat_body())
    assert status == 200


async def test_a_flood_of_large_bodies_never_holds_more_than_the_tenant_share(front):
    gw = await front(total_bytes=8 * MiB, tenant_bytes=8 * MiB, wait_seconds=0.2)
    attacker, attacker_key = await gw.tenant(max_concurrency=2)
    _, victim_key = await gw.tenant()
    most = 0

    async def watch():
        nonlocal most
        while True:
            most = max(most, gw.budget.held_by(attacker))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    body = chat_body(MiB - 1024)
    # Half declare their length, half send chunks: both ways are reserved before read.
    flood = [
        asyncio.create_task(post(gw.port, attacker_key, body, chunked=i % 2 == 1))
        for i in range(40)
    ]
    victim = await post(gw.port, victim_key, chat_body())
    results = await asyncio.gather(*flood)
    watcher.cancel()

    assert victim[0] == 200
    statuses = {status for status, _, _ in results}
    assert statuses <= {200, 429}, [b for s, _, b in results if s == 503][:2]
    assert 0 < most <= 2 * MiB
    await until(lambda: gw.budget.held == 0, "every reservation given back")


async def test_a_streaming_request_holds_neither_budget_nor_body_while_it_streams(front):
    gw = await front(total_bytes=8 * MiB, tenant_bytes=8 * MiB)
    _, key = await gw.tenant()
    engine = gw.cluster.engines[0]
    engine.stall_after = 1
    body = chat_body(MiB - 1024, stream=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(head(key, len(body)) + body)
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await until(lambda: engine.active, "the stream under way")

    assert gw.budget.held == 0
    gc.collect()
    requests = [o for o in gc.get_objects() if type(o) is Request]
    assert not [r for r in requests if "_body" in r.__dict__ or "_json" in r.__dict__]
    writer.close()
