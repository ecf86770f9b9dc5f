"""The chart bounds Redis and alerts before it is full (issue 16, item 1)."""

from pathlib import Path

import kubernetes_validate
from prometheus_client import REGISTRY

import maas_services.billing.retention  # noqa: F401  (registers the Redis memory gauges)
from tests.integration.observability.promql import metric_names
from tests.k8s import test_chart
from tests.k8s.test_chart import KUBERNETES_VERSION, render_refused, render_set

helm = test_chart.helm  # the fixture
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def redis_args(docs) -> list[str]:
    (redis,) = [
        d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "maas-redis"
    ]
    kubernetes_validate.validate(redis, KUBERNETES_VERSION, strict=True)
    return redis["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_redis_maxmemory_is_60_percent_of_its_limit_and_never_evicts(helm):
    args = redis_args(render_set(helm))
    assert flag(args, "--maxmemory") == str(1024**3 * 60 // 100)
    assert flag(args, "--maxmemory-policy") == "noeviction"
    args = redis_args(render_set(helm, "redis.resources.limits.memory=4Gi"))
    assert flag(args, "--maxmemory") == str(4 * 1024**3 * 60 // 100)
    assert flag(redis_args(render_set(helm, "redis.maxmemory=3gb")), "--maxmemory") == "3gb"


def test_a_limit_the_chart_cannot_size_is_refused(helm):
    assert "redis.maxmemory" in render_refused(helm, "redis.resources.limits.memory=1.5G")


def test_prometheus_rule_alerts_on_redis_memory_against_its_maxmemory(helm):
    assert not [d for d in render_set(helm) if d["kind"] == "PrometheusRule"]
    docs = render_set(helm, "prometheusRule.enabled=true", "prometheusRule.labels.release=kps")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    memory = alerts["MaasRedisMemoryHigh"]
    assert memory["expr"].endswith("> 0.8") and memory["labels"]["severity"] == "warning"
    # Billing samples Redis and exports what the rule reads; both are documented.
    used = metric_names(memory["expr"])
    assert used == {"maas_redis_memory_used_bytes", "maas_redis_memory_max_bytes"}
    exported = {m.name for m in REGISTRY.collect()}
    assert used <= exported
    assert all(f"`{name}`" in DOCS.read_text() for name in used)


def test_prometheus_rule_alerts_when_billing_lags_behind_the_usage_stream(helm):
    docs = render_set(
        helm,
        "prometheusRule.enabled=true",
        "prometheusRule.billingLagSeconds=120",
        "prometheusRule.billingLagFor=5m",
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    lag = alerts["MaasBillingLagHigh"]
    assert lag["expr"] == "max by (namespace) (maas_billing_lag_seconds) > 120"
    assert lag["for"] == "5m"
    # Billing's trimmer exports the lag of the oldest event not yet committed.
    assert metric_names(lag["expr"]) <= {m.name for m in REGISTRY.collect()}
    defaults = render_set(helm, "prometheusRule.enabled=true")
    (rule,) = [d for d in defaults if d["kind"] == "PrometheusRule"]
    lag = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}[
        "MaasBillingLagHigh"
    ]
    assert lag["expr"].endswith("> 300") and lag["for"] == "10m"
