"""The chart's operational alerts watch metrics the services export, all documented:
quarantined usage lines, a replica that failed its start-up check, a shedding queue."""

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import maas_services.engine.known_answer_gauge  # noqa: F401  (registers the gauge)
import maas_services.gateway.admission.fair_queue  # noqa: F401  (registers the shedding counter)
import maas_services.gateway.http_api.tracing_middleware  # noqa: F401  (the request counts)
import maas_services.gateway.usage.usage_spool  # noqa: F401  (registers the quarantine counter)
from tests.integration.observability.promql import metric_names, series_names
from tests.k8s.test_chart import helm, render_set  # noqa: F401 (helm is a fixture)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def alerts(helm, *values: str) -> dict[str, dict]:  # noqa: F811
    docs = render_set(helm, "prometheusRule.enabled=true", *values)
    (rules,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for group in rules["spec"]["groups"] for r in group["rules"]}


def exported_series() -> set[str]:
    """Every name a query may use for the metrics this process registers."""
    return {name for m in REGISTRY.collect() for name in series_names(m.name, m.type)}


@pytest.mark.parametrize(
    ("alert", "reads"),
    [
        ("MaasUsageSpoolQuarantined", {"maas_gateway_usage_spool_quarantined_total"}),
        ("MaasEngineKnownAnswerFailed", {"maas_engine_known_answer_failed"}),
        (
            "MaasGatewayQueueShedding",
            {"maas_gateway_queue_rejected_total", "maas_gateway_e2e_request_latency_seconds_count"},
        ),
    ],
)
def test_each_alert_reads_exported_documented_metrics(helm, alert, reads):  # noqa: F811
    rule = alerts(helm)[alert]
    used = metric_names(rule["expr"])
    assert used == reads
    assert used <= exported_series()
    documented = DOCS.read_text()
    for name in used:
        family = name.removesuffix("_count")
        assert f"`{name}`" in documented or f"`{family}`" in documented, name
    assert rule["labels"]["severity"] == "warning"
    assert "{{ $labels." in rule["annotations"]["summary"]


def test_quarantine_alert_sees_lines_set_aside_before_the_first_scrape(helm):  # noqa: F811
    expr = alerts(helm)["MaasUsageSpoolQuarantined"]["expr"]
    assert "increase(maas_gateway_usage_spool_quarantined_total[15m]) > 0" in expr
    assert "unless maas_gateway_usage_spool_quarantined_total offset 15m" in expr


def test_shedding_alert_is_a_share_of_requests(helm):  # noqa: F811
    rule = alerts(helm)["MaasGatewayQueueShedding"]
    assert rule["expr"].endswith("> 0.05")  # prometheusRule.queueShedRatio
    assert "by (namespace, reason)" in rule["expr"]
    assert rule["for"] == "10m"
