"""Billing's probes in the chart: readiness follows the consumer (the server's
overall gRPC health), while startup and liveness ask the loop's own heartbeat,
so a Redis outage takes billing out of its Service without restarting it."""

import kubernetes_validate

from maas_services.billing.health import LIVENESS_SERVICE
from tests.k8s.test_chart import KUBERNETES_VERSION, helm, render_set  # noqa: F401


def containers(docs) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
        for d in docs
        if d["kind"] == "Deployment"
    }


def test_billing_is_restarted_only_when_its_loop_stops_turning(helm):  # noqa: F811
    docs = render_set(helm)
    by_name = containers(docs)
    billing = by_name["maas-billing"]
    port = billing["readinessProbe"]["grpc"]["port"]
    assert billing["readinessProbe"]["grpc"] == {"port": port}
    for probe in ("startupProbe", "livenessProbe"):
        assert billing[probe]["grpc"] == {"port": port, "service": LIVENESS_SERVICE}
    # Services whose health depends on nothing outside them keep one name.
    for name in ("maas-router", "maas-tokenizer"):
        assert "service" not in by_name[name]["livenessProbe"]["grpc"]
    (deployment,) = [
        d for d in docs if d["metadata"]["name"] == "maas-billing" and d["kind"] == "Deployment"
    ]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
