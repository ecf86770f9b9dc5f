"""`helm test`: the chart's test pod, and the very command it runs, run here against
the real stack's gateway with a real tenant key (and with a wrong key, and none)."""

import runpy
import subprocess
import sys

import kubernetes_validate
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.e2e.tenants import new_tenant_key
from tests.k8s.test_chart import CHART, KUBERNETES_VERSION, helm, render_set  # noqa: F401

HOOK = "helm.sh/hook"


def helm_test_pod(docs) -> dict:
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    return pod


def run_the_pods_command(pod: dict, **env: str) -> subprocess.CompletedProcess:
    """The container's command, with its env (values given here replace the cluster's:
    the gateway's address, the key the Secret would hold), on this machine's Python."""
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["python", "-c"]
    rendered = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return subprocess.run(
        [sys.executable, *command[1:]],
        env={**rendered, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_test_pod_is_a_helm_test_hook_and_locked_down(helm):  # noqa: F811
    docs = render_set(helm)
    pod = helm_test_pod(docs)
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    assert pod["metadata"]["annotations"][HOOK] == "test"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The script is the chart's file, as it is.
    assert container["command"][2].strip() == (CHART / "files" / "helm_test.py").read_text().strip()
    env = {e["name"]: e for e in container["env"]}
    assert env["MAAS_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "maas-helm-test",
        "key": "api-key",
        "optional": True,
    }
    # The gateway's Service, on its http port (80), and the example's model.
    assert env["MAAS_GATEWAY_URL"]["value"] == "http://maas-gateway.maas.svc"
    (service,) = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "maas-gateway"
    ]
    assert {"name": "http", "port": 80, "targetPort": "http"} in service["spec"]["ports"]
    assert env["MAAS_TEST_MODEL"]["value"] == DEFAULT_MODEL_ID
    named = helm_test_pod(render_set(helm, "tests.apiKeySecret=keys", "tests.apiKeySecretKey=k"))
    ref = named["spec"]["containers"][0]["env"]
    assert {"name": "keys", "key": "k", "optional": True} in [
        e["valueFrom"]["secretKeyRef"] for e in ref if "valueFrom" in e
    ]


def test_a_gateway_closed_to_others_still_admits_the_helm_test_pod(helm):  # noqa: F811
    docs = render_set(
        helm, "networkPolicy.gatewayFrom[0].namespaceSelector.matchLabels.team=frontend"
    )
    (policy,) = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "maas-gateway"
    ]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    peers = policy["spec"]["ingress"][0]["from"]
    labels = helm_test_pod(docs)["metadata"]["labels"]
    assert {"namespaceSelector": {"matchLabels": {"team": "frontend"}}} in peers
    (test_peer,) = [p for p in peers if "podSelector" in p]
    assert test_peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_without_a_key_the_test_says_how_to_make_one(helm):  # noqa: F811
    done = run_the_pods_command(helm_test_pod(render_set(helm)), MAAS_API_KEY="")
    assert done.returncode == 2
    assert "no API key" in done.stderr and "kubectl" in done.stderr


def test_the_shape_check_names_what_is_missing():
    check = runpy.run_path(str(CHART / "files" / "helm_test.py"))["shape_problems"]
    answer = {
        "object": "chat.completion",
        "choices": [
            {
                "message": {"role": "assistant", "content": "Paris."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }
    assert check(answer) == []
    assert check({**answer, "usage": {}}) == ["usage is {}"]
    assert check({**answer, "choices": []}) == ["no choices"]
    assert check([answer]) == ["the body is not a JSON object"]


@pytest.mark.slow
async def test_the_test_passes_against_a_real_gateway_and_fails_with_a_wrong_key(helm, stack):  # noqa: F811
    pod = helm_test_pod(render_set(helm, "tests.waitSeconds=30"))
    _, key = await new_tenant_key(stack.redis_url, "helm-test")
    done = run_the_pods_command(pod, MAAS_GATEWAY_URL=stack.gateway_url, MAAS_API_KEY=key)
    assert done.returncode == 0, done.stderr
    assert f"{DEFAULT_MODEL_ID} answered:" in done.stdout
    wrong = run_the_pods_command(pod, MAAS_GATEWAY_URL=stack.gateway_url, MAAS_API_KEY="sk-wrong")
    assert wrong.returncode == 1
    assert "HTTP 401" in wrong.stderr
