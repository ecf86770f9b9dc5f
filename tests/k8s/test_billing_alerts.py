"""The chart's billing alerts watch the metrics billing exports: requests billed
without a price (per deployment), and a consumer that stops keeping up."""

from maas_services.billing.health import READY
from maas_services.billing.ledger import UNPRICED
from tests.k8s.test_chart import helm, render_set  # noqa: F401 (helm is a fixture)


def test_unpriced_events_alert_watches_the_ledgers_counter(helm):  # noqa: F811
    docs = render_set(helm, "prometheusRule.enabled=true")
    (rules,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for group in rules["spec"]["groups"] for r in group["rules"]}
    alert = alerts["MaasBillingUnpricedEvents"]
    assert f"{UNPRICED.describe()[0].name}_total" in alert["expr"]
    assert "by (deployment)" in alert["expr"]
    assert "{{ $labels.deployment }}" in alert["annotations"]["summary"]


def test_billing_consumer_not_ready_alert_watches_the_readiness_gauge(helm):  # noqa: F811
    docs = render_set(helm, "prometheusRule.enabled=true", "prometheusRule.billingNotReadyFor=7m")
    (rules,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for group in rules["spec"]["groups"] for r in group["rules"]}
    alert = alerts["MaasBillingConsumerNotReady"]
    assert alert["expr"] == f"{READY.describe()[0].name} == 0"
    assert alert["for"] == "7m"
    assert alert["labels"]["severity"] == "critical"
