"""Billing's retention settings are chart values: what the Deployment's env sets is
what BillingSettings reads, so the ledger keeps what the values say."""

import kubernetes_validate

from maas_services.billing.ledger import DAY, Retention
from maas_services.billing.settings import BillingSettings
from tests.k8s.test_chart import KUBERNETES_VERSION, helm, render_refused, render_set  # noqa: F401


def billing_env(docs) -> dict[str, str]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "maas-billing"
    ]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def settings_from(env: dict[str, str], monkeypatch) -> BillingSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return BillingSettings()


def test_default_values_keep_the_ledgers_default_retention(helm, monkeypatch):  # noqa: F811
    settings = settings_from(billing_env(render_set(helm)), monkeypatch)
    assert settings.retention() == Retention()
    assert settings.trim_interval_seconds == 5


def test_retention_values_reach_billing(helm, monkeypatch):  # noqa: F811
    docs = render_set(
        helm,
        "billing.retention.lineItemDays=30",
        "billing.retention.hourlyDays=7",
        "billing.retention.dailyDays=800",
        "billing.retention.dedupWindowDays=2",
        "billing.retention.trimIntervalSeconds=2",
    )
    settings = settings_from(billing_env(docs), monkeypatch)
    assert settings.retention() == Retention(
        line_items=30 * DAY, hourly=7 * DAY, daily=800 * DAY, dedup_window=2 * DAY
    )
    assert settings.trim_interval_seconds == 2


def test_a_trim_interval_billing_would_refuse_fails_the_install(helm):  # noqa: F811
    assert "trimIntervalSeconds" in render_refused(helm, "billing.retention.trimIntervalSeconds=60")
