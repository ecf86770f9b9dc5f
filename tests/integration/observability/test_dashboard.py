"""The Grafana dashboard reads only metrics the services really export, all documented.

The running stack is scraped after a request; the operator is not part of a
local stack, so its metrics are read from its module's registry instead.
"""

import json
import re
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.integration.observability.promql import dashboard_exprs, metric_names, series_names

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "dashboards" / "maas.json"
CHART_DASHBOARD = ROOT / "charts" / "maas" / "dashboards" / "maas.json"
DOCS = ROOT / "docs" / "metrics.md"
GRPC_TEMPLATE = re.compile(r"maas_[a-z]+_grpc_(server|client)_(handled_total|handling_seconds)")


@pytest.fixture(scope="module")
def exported(stack) -> dict[str, str]:
    """Family name -> type, of every maas_ family any service of the running stack exports."""
    client = openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key)
    for _ in client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        stream=True,
    ):
        pass
    families = {}
    for url in stack.metrics_urls.values():
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            if family.name.startswith("maas_") and not family.name.endswith("_created"):
                families[family.name] = family.type
    return families


def operator_families() -> dict[str, str]:
    import maas_operator.modeldeployment.metrics  # noqa: F401  (registers them)

    return {
        metric.name: metric.type
        for metric in REGISTRY.collect()
        if metric.name.startswith("maas_operator_")
    }


def test_the_chart_ships_the_same_dashboard():
    assert CHART_DASHBOARD.read_bytes() == DASHBOARD.read_bytes()


def test_metric_names_skip_functions_labels_and_windows():
    expr = (
        'histogram_quantile(0.99, sum by (le, op) (rate(a_bucket{k="v"}[5m])))'
        " / on (pod) group_left max by (pod) (b) > bool 0.5"
    )
    assert metric_names(expr) == {"a_bucket", "b"}


def test_every_dashboard_query_reads_exported_metrics(exported):
    available = set()
    for name, kind in {**exported, **operator_families()}.items():
        available |= series_names(name, kind)
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    assert len(exprs) > 30
    used = {name: expr for expr in exprs for name in metric_names(expr)}
    assert all(name.startswith("maas_") for name in used), used
    missing = {name: expr for name, expr in used.items() if name not in available}
    assert not missing, f"not exported by any service: {missing}"


def test_every_exported_metric_is_documented(exported):
    docs = DOCS.read_text()
    for name, kind in {**exported, **operator_families()}.items():
        queried = f"{name}_total" if kind == "counter" else name
        if GRPC_TEMPLATE.fullmatch(queried):
            queried = GRPC_TEMPLATE.sub(r"maas_<service>_grpc_\1_\2", queried)
        assert f"`{queried}`" in docs, f"{queried} ({kind}) is not in docs/metrics.md"
