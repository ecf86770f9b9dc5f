"""`maas tenants ...` / `maas keys ...` against real Redis, found via MAAS_REDIS_URL."""

import json
import uuid

from tests.integration.conftest import as_json


def test_tenant_lifecycle(admin):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    created = as_json(
        admin(
            "tenants",
            "create",
            "--name",
            name,
            "--rpm",
            "10",
            "--tpm",
            "500",
            "--max-concurrency",
            "2",
            "--models",
            "a,b",
            "--json",
        )
    )
    assert created["tenant"]["rpm"] == 10 and created["tenant"]["allowed_models"] == ["a", "b"]
    assert created["api_key"].startswith("sk-maas-") and created["key_id"].startswith("key_")
    assert name in [t["name"] for t in as_json(admin("tenants", "list", "--json"))]
    updated = as_json(admin("tenants", "update", "--name", name, "--tier", "premium", "--json"))
    assert (updated["tier"], updated["rpm"]) == ("premium", 10)
    assert as_json(admin("tenants", "disable", "--name", name, "--json"))["status"] == "disabled"

    key = as_json(admin("keys", "create", "--tenant", name, "--json"))
    assert key["api_key"] != created["api_key"]
    revoked = as_json(admin("keys", "revoke", "--key-id", key["key_id"], "--json"))
    assert revoked == {"key_id": key["key_id"], "status": "revoked"}

    code, out, _ = admin("tenants", "list")
    assert code == 0 and name in out and "premium" in out


def test_mistakes_are_reported_not_raised(admin):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    assert admin("tenants", "create", "--name", name)[0] == 0
    code, _, err = admin("tenants", "create", "--name", name)
    assert code == 1 and "already exists" in err
    assert admin("keys", "create", "--tenant", "no-such-tenant")[0] == 1
    assert admin("keys", "revoke", "--key-id", "key_000000000000")[0] == 1
    assert admin("tenants", "update", "--name", name, "--rpm", "-5")[0] == 2


def test_without_redis_url_the_local_stack_is_found(admin, redis_url, monkeypatch, tmp_path):
    monkeypatch.delenv("MAAS_REDIS_URL")
    code, _, err = admin("tenants", "list", "--state-dir", str(tmp_path))
    assert code == 1 and "maas up" in err
    (tmp_path / "stack.json").write_text(json.dumps({"redis_url": redis_url}))
    assert isinstance(
        as_json(admin("tenants", "list", "--state-dir", str(tmp_path), "--json")), list
    )
