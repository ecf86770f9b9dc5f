"""A small async client for the few Kubernetes calls the operator makes.

kopf watches and patches the ModelDeployments; the owned objects go through
here, over aiohttp, with the same credentials kopf logged in with. The full
`kubernetes` client is only used to find those credentials (kopf's
login_via_client), not for calls: it is synchronous.
"""

import ssl
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

BASE_PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
}


class KubeError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


@dataclass
class Credentials:
    """What kopf.login_via_client finds: a server, a token, and file paths."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None

    @classmethod
    def from_connection_info(cls, info) -> "Credentials":
        return cls(
            server=info.server,
            token=info.token,
            ca_path=info.ca_path,
            insecure=bool(info.insecure),
            certificate_path=info.certificate_path,
            private_key_path=info.private_key_path,
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https") or self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_path)
        if self.certificate_path and self.private_key_path:
            context.load_cert_chain(self.certificate_path, self.private_key_path)
        return context


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    base = BASE_PATHS[kind].format(ns=quote(namespace))
    return f"{base}/{quote(name)}" if name else base


class KubeApi:
    def __init__(self, credentials: Credentials):
        self._credentials = credentials
        self._session: aiohttp.ClientSession | None = None

    def update(self, credentials: Credentials) -> None:
        """New credentials (kopf logged in again); the next call reconnects."""
        self._credentials = credentials
        self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self._credentials.token:
                headers["Authorization"] = f"Bearer {self._credentials.token}"
            self._session = aiohttp.ClientSession(
                base_url=self._credentials.server.rstrip("/") + "/",
                headers=headers,
                connector=aiohttp.TCPConnector(ssl=self._credentials.ssl_context()),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, body=None, content_type: str | None = None):
        headers = {"Content-Type": content_type} if content_type else {}
        async with self._client().request(
            method, path.lstrip("/"), json=body, headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise KubeError(response.status, method, path, text)
            return await response.json(content_type=None) if text else None

    async def get(self, path: str) -> dict | None:
        try:
            return await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, path: str, body: dict) -> dict:
        return await self._call("POST", path, body)

    async def merge_patch(self, path: str, body: dict) -> dict:
        return await self._call("PATCH", path, body, "application/merge-patch+json")

    async def json_patch(self, path: str, ops: list[dict]) -> dict:
        return await self._call("PATCH", path, ops, "application/json-patch+json")

    async def delete(self, path: str) -> bool:
        """True when something was deleted; a missing object is not an error."""
        try:
            await self._call("DELETE", path, {"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
