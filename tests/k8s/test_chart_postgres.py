"""Billing's database in the chart (issue 37): the chart's PostgreSQL or an external
one, and the one URL billing gets either way.

The URL is checked where it matters: expanded as the kubelet expands `$(VAR)`, it
logs in to a real PostgreSQL server set up as the postgres image's entrypoint sets
one up from the chart's env (user, password, database), and the chart's own
probe command asks that server. helm template has no cluster, so `lookup`'s
keeping of a generated password across upgrades is not exercised here.
"""

import base64
import re
import subprocess

import asyncpg
import kubernetes_validate
import pytest

from tests.k8s.test_chart import (  # noqa: F401 (helm is a fixture)
    KUBERNETES_VERSION,
    helm,
    render_refused,
    render_set,
)
from tests.postgres import PostgresServer, running_postgres

EXTERNAL = "postgresql://billing@db.example.com:5432/maas?sslmode=require"


def named(docs, kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    return doc


def billing_env(docs) -> list[dict]:
    return named(docs, "Deployment", "maas-billing")["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]


def expanded(env: list[dict], name: str, secrets: dict[tuple[str, str], str]) -> str:
    """An env var's value as the container sees it: the secretKeyRefs given read, and
    `$(VAR)` replaced by the value of a variable defined earlier in the list, as the
    kubelet does (a reference to one not defined stays as it is)."""
    values: dict[str, str] = {}
    for entry in env:
        if "valueFrom" in entry:
            ref = entry["valueFrom"].get("secretKeyRef", {})
            if (ref.get("name"), ref.get("key")) not in secrets:
                continue
            value = secrets[(ref["name"], ref["key"])]
        else:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: values.get(m[1], m[0]),
                entry["value"],
            )
        values[entry["name"]] = value
    return values[name]


def test_the_chart_runs_postgres_with_its_data_on_a_volume(helm):  # noqa: F811
    docs = render_set(helm)
    statefulset = named(docs, "StatefulSet", "maas-postgres")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "postgres:15"
    assert pod["securityContext"]["runAsUser"] == 999 and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "maas-postgres",
        "key": "password",
    }
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/var/lib/postgresql/data"] == "data"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"][0] == "pg_isready"
    assert container["resources"]["limits"]["memory"]
    service = named(docs, "Service", "maas-postgres")
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == "maas-postgres"


def test_the_generated_password_is_kept_on_uninstall_and_given_to_billing(helm):  # noqa: F811
    docs = render_set(helm)
    secret = named(docs, "Secret", "maas-postgres")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    url = expanded(
        billing_env(docs), "MAAS_BILLING_DATABASE_URL", {("maas-postgres", "password"): password}
    )
    assert url == f"postgresql://maas:{password}@maas-postgres:5432/maas"
    # A password given in values is used as it is.
    given = render_set(helm, "postgres.password=given-one")
    secret = named(given, "Secret", "maas-postgres")
    assert base64.b64decode(secret["data"]["password"]) == b"given-one"


def test_only_billing_and_the_gateway_may_reach_postgres(helm):  # noqa: F811
    """Billing's line items and the gateway's stored responses (/v1/responses)."""
    policy = named(render_set(helm), "NetworkPolicy", "maas-postgres")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
    assert [
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]
    ] == ["billing", "gateway"]


def test_the_gateway_keeps_its_stored_responses_in_the_same_database(helm):  # noqa: F811
    for settings in [
        (),
        (
            f"billing.database.external.url={EXTERNAL}",
            "billing.database.external.existingSecret=billing-db",
            "billing.database.external.existingSecretPasswordKey=pw",
        ),
    ]:
        docs = render_set(helm, *settings)
        gateway = named(docs, "Deployment", "maas-gateway")["spec"]["template"]["spec"]
        secrets = {("billing-db", "pw"): "s3cret", ("maas-postgres", "password"): "gen"}
        responses = expanded(
            gateway["containers"][0]["env"], "MAAS_RESPONSES_DATABASE_URL", secrets
        )
        billing = expanded(billing_env(docs), "MAAS_BILLING_DATABASE_URL", secrets)
        assert responses == billing


def test_an_external_database_replaces_the_charts(helm):  # noqa: F811
    docs = render_set(
        helm,
        f"billing.database.external.url={EXTERNAL}",
        "billing.database.external.existingSecret=billing-db",
        "billing.database.external.existingSecretPasswordKey=pw",
    )
    assert not [d for d in docs if "postgres" in d["metadata"]["name"]]
    secrets = {("billing-db", "pw"): "s3cret"}
    url = expanded(billing_env(docs), "MAAS_BILLING_DATABASE_URL", secrets)
    assert url == "postgresql://billing:s3cret@db.example.com:5432/maas?sslmode=require"
    # Without a Secret, the URL is billing's as given (its own credentials, or none).
    plain = render_set(helm, f"billing.database.external.url={EXTERNAL}")
    env = {e["name"]: e for e in billing_env(plain)}
    assert env["MAAS_BILLING_DATABASE_URL"]["value"] == EXTERNAL
    assert "MAAS_BILLING_DATABASE_PASSWORD" not in env


def test_external_database_settings_the_chart_cannot_use_are_refused(helm):  # noqa: F811
    assert "needs billing.database.external.url" in render_refused(
        helm, "billing.database.external.existingSecret=billing-db"
    )
    assert "needs a user" in render_refused(
        helm,
        "billing.database.external.url=postgresql://db.example.com/maas,"
        "billing.database.external.existingSecret=billing-db",
    )
    assert "/billing/database/external/url" in render_refused(
        helm, "billing.database.external.url=mysql://db.example.com/maas"
    )


@pytest.fixture(scope="module")
def server():
    yield from running_postgres()


def as_the_image_sets_up(server: PostgresServer, container: dict) -> str:
    """What the postgres image's entrypoint does with the chart's env on a fresh volume:
    the user with its password (scram-sha-256 over TCP) and the database it owns."""
    env = {e["name"]: e.get("value") for e in container["env"]}
    user, database = env["POSTGRES_USER"], env["POSTGRES_DB"]
    password = "p4ssw0rd-from-the-secret"
    psql = [str(server.bin / "psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    for sql in (
        f"CREATE ROLE {user} LOGIN PASSWORD '{password}'",
        f"CREATE DATABASE {database} OWNER {user}",
    ):
        done = subprocess.run([*psql, "-c", sql], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    # The first matching line wins: this user must show its password (the server's
    # other lines trust everyone, for the superuser above).
    hba = server.data / "pg_hba.conf"
    hba.write_text(f"host all {user} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    done = subprocess.run(
        [*psql, "-c", "SELECT pg_reload_conf()"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return password


async def test_billings_url_logs_in_to_a_server_set_up_from_the_charts_env(helm, server):  # noqa: F811
    docs = render_set(helm, f"postgres.port={server.port}")
    container = named(docs, "StatefulSet", "maas-postgres")["spec"]["template"]["spec"][
        "containers"
    ][0]
    password = as_the_image_sets_up(server, container)
    # The chart's probe asks the server, over TCP, as the chart's user.
    probe = container["readinessProbe"]["exec"]["command"]
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    url = expanded(
        billing_env(docs), "MAAS_BILLING_DATABASE_URL", {("maas-postgres", "password"): password}
    )
    # In the cluster the name is the headless Service's; here the server is on loopback.
    url = url.replace("@maas-postgres:", "@127.0.0.1:")
    connection = await asyncpg.connect(url)
    try:
        row = await connection.fetchrow("SELECT current_user, current_database()")
    finally:
        await connection.close()
    assert tuple(row) == ("maas", "maas")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(url.replace(password, "not-the-password"))
