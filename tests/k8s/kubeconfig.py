"""A kubeconfig that points the `kubernetes` client at kmock's emulator."""

from pathlib import Path


def write_kubeconfig(path: Path, server_url, token: str, namespace: str) -> Path:
    """One cluster, one user with a bearer token (what the RBAC checks tell callers apart by)."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{server_url}"}}}}]
users: [{{name: caller, user: {{token: {token}}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: caller, namespace: {namespace}}}}}]
current-context: kmock
"""
    )
    return path
