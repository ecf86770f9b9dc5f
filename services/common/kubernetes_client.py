"""The `kubernetes` client a service talks to the API server with.

In a pod, its service account; outside, a kubeconfig. Never the client's
global default configuration, which another library may have changed.
"""

from pathlib import Path

from kubernetes import client, config

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client(kubeconfig: str = "") -> client.ApiClient:
    if not kubeconfig:
        in_cluster = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=in_cluster)
            return client.ApiClient(in_cluster)
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig or None)


def own_namespace(default: str = "default") -> str:
    """The pod's namespace, from its service account; `default` outside a cluster."""
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return default
