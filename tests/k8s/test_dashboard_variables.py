"""The dashboard picks a namespace and a model: every query honours both where its
series can carry them, and the chart's scrape gives engine series their model."""

import json
from pathlib import Path

from tests.integration.observability.promql import dashboard_exprs
from tests.k8s.test_chart import helm, render_set  # noqa: F401 (helm is a fixture)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "dashboards" / "maas.json"
# Series with a model label: engines' (from their pod, below) and those labelled by model.
BY_MODEL = ("maas_engine_", "maas_gateway_tokens", "maas_router_picks", "maas_router_deployment_")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_has_namespace_and_model_variables_defaulting_to_all():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name in ("namespace", "model"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["multi"]
        # All matches a series without the label too (a scrape that does not add it).
        assert variables[name]["allValue"] == ".*"
    assert '$namespace"' in variables["model"]["query"]["query"]


def test_every_query_filters_by_namespace_and_model_where_it_can():
    exprs = dashboard_exprs(dashboard())
    for expr in exprs:
        selectors = expr.count("maas_")
        assert expr.count('namespace=~"$namespace"') == selectors, expr
        by_model = sum(expr.count(prefix) for prefix in BY_MODEL)
        assert expr.count('model=~"$model"') == by_model, expr
    assert any('model=~"$model"' in expr for expr in exprs)


def test_the_scrape_labels_engine_series_with_their_model(helm):  # noqa: F811
    docs = render_set(helm, "serviceMonitor.enabled=true")
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_maas_io_model"],
        "targetLabel": "model",
    } in endpoint["relabelings"]
