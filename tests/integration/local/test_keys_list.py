"""`maas keys list` against a real Redis: every key with its tenant's limits, never a secret."""

import asyncio
import json
import uuid

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import hash_key
from tests.integration.conftest import as_json


def new_tenant(admin, *limits: str) -> tuple[str, dict]:
    name = f"keys-{uuid.uuid4().hex[:8]}"
    return name, as_json(admin("tenants", "create", "--name", name, *limits, "--json"))


def test_a_tenants_keys_with_status_and_limits_and_no_secret(admin):
    name, created = new_tenant(admin, "--rpm", "60", "--tpm", "9000", "--max-tokens", "256")
    second = as_json(admin("keys", "create", "--tenant", name, "--json"))
    as_json(admin("keys", "revoke", "--key-id", created["key_id"], "--json"))

    code, out, err = admin("keys", "list", "--tenant", name, "--json")
    assert code == 0, err
    keys = json.loads(out)
    assert [(k["key_id"], k["status"]) for k in keys] == [
        (created["key_id"], "revoked"),
        (second["key_id"], "active"),
    ]
    limits = {
        (k["tenant"], k["rpm"], k["tpm"], k["max_concurrency"], k["max_tokens"]) for k in keys
    }
    assert limits == {(name, 60, 9000, 0, 256)}
    assert keys[0]["created"] <= keys[1]["created"] and keys[0]["created"].endswith("+00:00")
    for secret in (created["api_key"], second["api_key"]):
        assert secret not in out and hash_key(secret) not in out


def test_every_tenants_keys_by_default_as_a_table(admin):
    first, a = new_tenant(admin)
    second, b = new_tenant(admin, "--max-concurrency", "3")
    keys = as_json(admin("keys", "list", "--json"))
    listed = {k["key_id"]: k["tenant"] for k in keys}
    assert listed[a["key_id"]] == first and listed[b["key_id"]] == second

    code, out, _ = admin("keys", "list")
    header, *rows = out.splitlines()
    assert header.split() == [
        "key_id",
        "tenant",
        "status",
        "created",
        "rpm",
        "tpm",
        "max_concurrency",
        "max_tokens",
    ]
    row = next(r for r in rows if b["key_id"] in r).split()
    assert code == 0 and row[1:3] == [second, "active"] and row[6] == "3"
    assert a["api_key"] not in out and b["api_key"] not in out


def test_an_unknown_tenant_is_reported_not_raised(admin):
    code, out, err = admin("keys", "list", "--tenant", "no-such-tenant")
    assert code == 1 and out == "" and "no-such-tenant" in err


def test_a_record_redis_cannot_read_is_listed_as_unreadable(admin, redis_url):
    name, created = new_tenant(admin)
    digest = hash_key(created["api_key"])

    async def corrupt() -> None:
        redis = open_redis(redis_url)
        try:
            await redis.delete(f"maas:apikey:{digest}")
            await redis.rpush(f"maas:apikey:{digest}", "not a key record")
        finally:
            await redis.aclose()

    asyncio.run(corrupt())
    (listed,) = as_json(admin("keys", "list", "--tenant", name, "--json"))
    assert (listed["key_id"], listed["status"]) == (created["key_id"], "unreadable")
    # Every tenant's listing, which meets it too, still answers.
    assert admin("keys", "list")[0] == 0
