"""`maas tenants --adapter-loads-per-minute`: set at create, changed by update, kept when
not given, refused when negative; 0 is the gateway's default (Tenant's field)."""

import uuid

from tests.integration.conftest import as_json

FLAG = "--adapter-loads-per-minute"


def test_the_adapter_load_limit_is_set_changed_and_kept(admin):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    created = as_json(admin("tenants", "create", "--name", name, FLAG, "5", "--json"))
    assert created["tenant"]["adapter_loads_per_minute"] == 5
    updated = as_json(admin("tenants", "update", "--name", name, FLAG, "12", "--json"))
    assert updated["adapter_loads_per_minute"] == 12
    # Another limit changed: this one stays.
    kept = as_json(admin("tenants", "update", "--name", name, "--rpm", "9", "--json"))
    assert (kept["rpm"], kept["adapter_loads_per_minute"]) == (9, 12)
    # 0: back to the gateway's own limit.
    reset = as_json(admin("tenants", "update", "--name", name, FLAG, "0", "--json"))
    assert reset["adapter_loads_per_minute"] == 0
    code, out, _ = admin("tenants", "list")
    assert code == 0 and "adapter_loads_per_minute" in out


def test_a_negative_limit_is_refused_and_changes_nothing(admin):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    assert admin("tenants", "create", "--name", name, FLAG, "3")[0] == 0
    code, _, err = admin("tenants", "update", "--name", name, FLAG, "-1")
    assert code == 2 and "adapter_loads_per_minute" in err
    assert admin("tenants", "create", "--name", f"{name}-b", FLAG, "-1")[0] == 2
    (tenant,) = [t for t in as_json(admin("tenants", "list", "--json")) if t["name"] == name]
    assert tenant["adapter_loads_per_minute"] == 3
    assert name + "-b" not in [t["name"] for t in as_json(admin("tenants", "list", "--json"))]
