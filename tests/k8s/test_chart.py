"""The Helm chart: lint, render, and validate every object offline.

Built-in kinds go through kubernetes-validate (strict: unknown fields fail);
ModelDeployments through the CRD's own schema. The helm binary comes from
`make install-helm` (deploy/install-helm.sh), which `make test` runs first.
"""

import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate as validate_model_deployment

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "maas"
KUBERNETES_VERSION = "1.35.0"  # what the pinned helm's client speaks
VALUES = {
    "default": [],
    "gpu": ["-f", str(CHART / "ci" / "gpu-values.yaml")],
    "platform": ["-f", str(CHART / "ci" / "platform-values.yaml")],
}
# Custom kinds kubernetes-validate has no schema for, and who checks them here
# (HTTPRoute: test_chart_ingress.py, against Gateway API's schema).
CUSTOM_KINDS = {"ModelDeployment", "ServiceMonitor", "PrometheusRule", "HTTPRoute"}


@pytest.fixture(scope="module")
def helm() -> str:
    path = ROOT / ".venv" / "bin" / "helm"
    found = str(path) if path.exists() else shutil.which("helm")
    if not found:
        pytest.fail("no helm binary: run `make install-helm`")
    return found


def run(helm: str, *args: str) -> str:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def render(helm: str, values: str) -> list[dict]:
    out = run(helm, "template", "maas", str(CHART), "-n", "maas", "--include-crds", *VALUES[values])
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendered(request, helm) -> list[dict]:
    return render(helm, request.param)


@pytest.mark.parametrize("values", sorted(VALUES))
def test_lint_strict(helm, values):
    run(helm, "lint", "--strict", str(CHART), *VALUES[values])


def test_lint_rejects_values_outside_the_schema(helm):
    result = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "--set", "gateway.httpPort=70000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "httpPort" in result.stdout + result.stderr


def test_every_object_validates(rendered):
    kinds = set()
    for doc in rendered:
        kinds.add(doc["kind"])
        if doc["kind"] == "ModelDeployment":
            assert validate_model_deployment(doc) == []
        elif doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    expected = {"CustomResourceDefinition", "Deployment", "StatefulSet", "Service"}
    expected |= {"ConfigMap", "ServiceAccount", "ClusterRole", "NetworkPolicy", "ModelDeployment"}
    assert expected <= kinds


def test_a_broken_object_fails_validation():
    # The check above can fail: an unknown field is an error in strict mode.
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPorts": 8080}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def _workloads(rendered):
    return [d for d in rendered if d["kind"] in ("Deployment", "StatefulSet")]


def test_components_are_all_there(rendered):
    names = {d["metadata"]["name"] for d in _workloads(rendered)}
    assert names == {
        f"maas-{c}"
        for c in ("gateway", "router", "tokenizer", "billing", "operator", "redis", "postgres")
    }


def test_pods_are_locked_down(rendered):
    for workload in _workloads(rendered):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert "readinessProbe" in container and "livenessProbe" in container
            assert container["resources"]["requests"], container["name"]


def test_only_the_operator_the_router_and_the_gateway_talk_to_the_api_server(rendered):
    talkers = ("maas-operator", "maas-router", "maas-gateway")
    for workload in _workloads(rendered):
        pod = workload["spec"]["template"]["spec"]
        automount = pod.get("automountServiceAccountToken", True)
        assert automount == (workload["metadata"]["name"] in talkers)
    rules = [r for d in rendered if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]
        # ConfigMaps: the operator's routes and engine-adapters ConfigMaps by name; a create
        # cannot name one.
        if "configmaps" in rule["resources"]:
            named = rule.get("resourceNames") in (
                ["maas-operator-routes"],
                ["maas-engine-adapters"],
            )
            assert named or rule["verbs"] == ["create"]


def test_grpc_services_use_grpc_probes_and_the_gateway_http(rendered):
    by_name = {d["metadata"]["name"]: d for d in _workloads(rendered)}
    for name in ("maas-router", "maas-tokenizer", "maas-billing"):
        (container,) = by_name[name]["spec"]["template"]["spec"]["containers"]
        assert "grpc" in container["readinessProbe"]
    (gateway,) = by_name["maas-gateway"]["spec"]["template"]["spec"]["containers"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_redis_keeps_an_append_only_file_on_a_volume(rendered):
    (redis,) = [d for d in _workloads(rendered) if d["metadata"]["name"] == "maas-redis"]
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_gpu_values_give_the_example_a_gpu_and_a_service_monitor(helm):
    docs = render(helm, "gpu")
    (example,) = [d for d in docs if d["kind"] == "ModelDeployment"]
    assert example["spec"]["resources"]["gpus"] == 1
    assert any(d["kind"] == "ServiceMonitor" for d in docs)


def test_gateway_metrics_stay_off_the_public_service(helm):
    docs = render(helm, "default")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    public = {p["name"] for p in services["maas-gateway"]["spec"]["ports"]}
    assert public == {"http", "grpc"}
    metrics = services["maas-gateway-metrics"]["spec"]
    assert metrics["type"] == "ClusterIP"
    assert [p["name"] for p in metrics["ports"]] == ["metrics"]
    assert metrics["selector"] == services["maas-gateway"]["spec"]["selector"]
    # The ServiceMonitor finds Services by this label and scrapes their port "metrics".
    labels = services["maas-gateway-metrics"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "maas"


def test_gateway_front_limits_come_from_values(helm):
    out = run(
        helm,
        "template",
        "maas",
        str(CHART),
        "--set",
        "gateway.maxConnections=7",
        "--set",
        "gateway.headerTimeoutSeconds=3",
    )
    (gateway,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["metadata"]["name"] == "maas-gateway" and d["kind"] == "Deployment"
    ]
    env = {
        e["name"]: e.get("value")
        for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MAAS_MAX_CONNECTIONS"] == "7"
    assert env["MAAS_HEADER_TIMEOUT_SECONDS"] == "3"
    assert {"MAAS_MAX_HEADER_BYTES", "MAAS_BODY_TIMEOUT_SECONDS", "MAAS_MAX_BODY_BYTES"} <= set(env)


def render_set(helm: str, *settings: str) -> list[dict]:
    args = [arg for setting in settings for arg in ("--set", setting)]
    out = run(helm, "template", "maas", str(CHART), "-n", "maas", *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_refused(helm: str, setting: str) -> str:
    """helm's error for values the chart must refuse (it fails to render them)."""
    result = subprocess.run(
        [helm, "template", "maas", str(CHART), "--set", setting],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, f"{setting} rendered"
    return result.stderr


OPERATOR = "maas-operator"


def _operator_env(docs) -> dict[str, str]:
    (operator,) = [d for d in _workloads(docs) if d["metadata"]["name"] == "maas-operator"]
    return {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def _by_kind(docs, kind: str, name: str | None = None) -> dict[str, dict]:
    return {
        d["metadata"].get("namespace", "maas"): d
        for d in docs
        if d["kind"] == kind and name in (None, d["metadata"]["name"])
    }


def test_operator_rights_are_namespaced_by_default(helm):
    docs = render_set(helm, "operator.watchNamespaces={team-a,team-b}")
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    managed = {"maas", "team-a", "team-b"}
    roles, bindings = _by_kind(docs, "Role", OPERATOR), _by_kind(docs, "RoleBinding", OPERATOR)
    assert set(roles) == set(bindings) == managed
    for binding in bindings.values():
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "maas-operator", "namespace": "maas"}
        ]
    # The one ClusterRole only reads CRDs and namespaces: it can change nothing.
    (cluster,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert {v for rule in cluster["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    assert json.loads(_operator_env(docs)["MAAS_NAMESPACES"]) == ["maas", "team-a", "team-b"]

    default = render_set(helm)
    assert set(_by_kind(default, "Role", OPERATOR)) == {"maas"}
    assert json.loads(_operator_env(default)["MAAS_NAMESPACES"]) == ["maas"]


def test_cluster_wide_rights_only_when_opted_in(helm):
    docs = render_set(helm, "operator.clusterWide=true")
    namespaced = {d["metadata"]["name"] for d in docs if d["kind"] in ("Role", "RoleBinding")}
    # Only the routes ConfigMap, in the release's namespace: the operator's and the gateway's.
    assert namespaced == {"maas-operator-routes", "maas-gateway"}
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert {"patch", "create"} <= {
        v for rule in roles["maas-operator"]["rules"] for v in rule["verbs"]
    }
    binding = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert binding["maas-operator"]["roleRef"]["name"] == "maas-operator"
    assert _operator_env(docs)["MAAS_NAMESPACES"] == "[]"


def test_engines_accept_only_the_release_callers_in_every_managed_namespace(helm):
    docs = render_set(helm, "operator.watchNamespaces={team-a}")
    engines = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "maas-engines"
    }
    assert set(engines) == {"maas", "team-a"}
    for policy in engines.values():
        kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
        grpc, metrics = policy["spec"]["ingress"]
        callers = {
            peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for peer in grpc["from"]
        }
        assert callers == {"gateway", "router", "operator"}
        for peer in grpc["from"]:
            # Without it the podSelector would match pods in the engine's namespace.
            assert peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": "maas"
            }
        assert metrics["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]


def test_operator_admits_the_release_images_and_what_the_values_add(helm):
    def policy(docs) -> AdmissionPolicy:
        env = _operator_env(docs)
        return AdmissionPolicy(
            tuple(json.loads(env["MAAS_ALLOWED_IMAGES"])), env["MAAS_CREDENTIALS_SECRET_PATTERN"]
        )

    default = policy(render_set(helm))
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert default.image_allowed(f"ghcr.io/maas-dev/maas:{version}")
    assert default.image_allowed("ghcr.io/maas-dev/maas@sha256:" + "0" * 64)
    assert not default.image_allowed("docker.io/library/vllm:latest")
    assert default.refusal(
        defaulted_spec({"model": {"source": {"credentialsSecret": "maas-redis"}}})
    )
    for example in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            assert default.refusal(defaulted_spec(doc["spec"])) is None, example.name

    added = policy(
        render_set(
            helm,
            "operator.engineImage=mirror.example.com/maas:1",
            "operator.allowedImages={vllm/vllm-openai:*}",
        )
    )
    assert added.image_allowed("mirror.example.com/maas:1")
    assert added.image_allowed("vllm/vllm-openai:v0.9.0")


def _secret_ref(container: dict, name: str) -> dict | None:
    env = {e["name"]: e for e in container.get("env", [])}
    return env.get(name, {}).get("valueFrom", {}).get("secretKeyRef")


def test_every_service_gets_the_token(helm):
    # Redis credentials per service: tests/k8s/test_chart_redis_acl.py.
    docs = render_set(helm)
    secret = "maas-internal-auth"
    for workload in _workloads(docs):
        name = workload["metadata"]["name"].removeprefix("maas-")
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        token = _secret_ref(container, "MAAS_SERVICE_TOKEN")
        if name in ("redis", "postgres"):
            assert token is None
            continue
        assert token == {"name": secret, "key": "service-token"}, name


def test_engine_namespaces_get_a_copy_of_the_token_and_vllm_key_only(helm):
    docs = render_set(helm, "operator.watchNamespaces={team-a}")
    secrets = _by_kind(docs, "Secret", "maas-internal-auth")
    assert set(secrets) == {"maas", "team-a"}
    assert set(secrets["team-a"]["data"]) == {"service-token", "vllm-api-key"}
    for key in ("service-token", "vllm-api-key"):
        assert secrets["team-a"]["data"][key] == secrets["maas"]["data"][key]
    assert secrets["maas"]["data"]["vllm-api-key"] != secrets["maas"]["data"]["service-token"]
    # vLLM's key is for engine pods only: no service of the release holds it.
    for workload in _workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            assert _secret_ref(container, "VLLM_API_KEY") is None


def test_the_operator_names_the_token_secret_to_its_engines(helm):
    assert _operator_env(render_set(helm))["MAAS_SERVICE_TOKEN_SECRET"] == "maas-internal-auth"


# Short names of well-known CRDs and built-in kinds a cluster running maas may also run:
# Cluster API, Knative Serving, KServe, Istio, Seldon Core, Argo, and the built-ins
# nearest to ours. Two kinds sharing a short name make `kubectl get` pick either.
KNOWN_SHORT_NAMES = {
    *("cl", "md", "ms", "ma", "mhc", "mp", "cc"),  # Cluster API
    *("ksvc", "kservice", "rt", "rev", "config", "cfg"),  # Knative Serving
    *("isvc", "ig", "tm"),  # KServe
    *("vs", "dr", "gw", "se", "pa", "ap", "ra", "we"),  # Istio
    "sdep",  # Seldon Core's SeldonDeployment
    *("app", "apps", "wf"),  # Argo CD, Argo Workflows
    *("deploy", "rs", "sts", "ds", "po", "svc", "cm", "pv", "pvc", "hpa", "pdb"),
}


def test_the_crd_short_names_collide_with_nothing_known():
    crd = yaml.safe_load((CHART / "crds" / "modeldeployments.maas.io.yaml").read_text())
    short = set(crd["spec"]["names"]["shortNames"])
    assert short == {"mdep"}
    assert not short & KNOWN_SHORT_NAMES
