"""The async Kubernetes client every service talks to the API server with: lightkube's.

In a pod, its service account; outside, the kubeconfig named (or KUBECONFIG,
or ~/.kube/config). One library for the operator, the router's discovery and
the gateway's routes watch (docs/operator.md, "One client"); kopf, which
runs the operator's ModelDeployment handlers, keeps its own.
"""

from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# Requests other than watches; a watch waits as long as the server keeps it open.
TIMEOUT_SECONDS = 30.0


def async_client(kubeconfig: str = "") -> AsyncClient:
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config, timeout=httpx2.Timeout(TIMEOUT_SECONDS), trust_env=False)


def own_namespace(default: str = "default") -> str:
    """The pod's namespace, from its service account; `default` outside a cluster."""
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return default
