"""The RBAC a real API server would enforce, for calls made against kmock.

Calls come from the emulator's request log, told apart by the bearer token each
client was given; grants come from the chart's rendered Roles, ClusterRoles and
their bindings to one ServiceAccount. Evaluation follows Kubernetes' RBAC
authorizer: a namespaced call is allowed by a RoleBinding in its namespace or a
ClusterRoleBinding, a call across all namespaces or on a cluster-scoped
resource only by a ClusterRoleBinding; rules match on API group, resource (with
its subresource), verb and, when a rule lists them, resource names.
"""

import fnmatch
from dataclasses import dataclass

import kmock

# What Kubernetes' default system:discovery and system:public-info-viewer
# ClusterRoles let every authenticated client read.
DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/version", "/version/")


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str  # with its subresource: modeldeployments/status
    namespace: str | None  # None: cluster-scoped, or across every namespace
    name: str | None

    def __str__(self) -> str:
        where = f"namespace {self.namespace}" if self.namespace else "the cluster"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.name or ''} in {where}"


def _verb(request: kmock.Request) -> str:
    method = request.method.value
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    if method == "DELETE":
        return "delete" if request.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def calls_by(emulator: kmock.KubernetesEmulator, token: str) -> tuple[set[Call], set[str]]:
    """The resource calls made with this token, and any other URLs it asked for
    that are not discovery (each of those is a call RBAC would judge too)."""
    found: set[Call] = set()
    other: set[str] = set()
    for request in emulator:
        if request.headers.get("Authorization") != f"Bearer {token}":
            continue
        # kmock reads a group's discovery document (/apis/GROUP/VERSION) as a resource
        # without a plural.
        if request.resource is None or request.resource.plural is None:
            if not any(fnmatch.fnmatchcase(request.url.path, p) for p in DISCOVERY_URLS):
                other.add(f"{request.method.value} {request.url.path}")
            continue
        resource = request.resource.plural
        if request.subresource:
            resource += f"/{request.subresource}"
        group = request.resource.group or ""
        found.add(Call(_verb(request), group, resource, request.namespace, request.name))
    return found, other


def _bound(binding: dict, service_account: str, namespace: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount"
        and s.get("name") == service_account
        and s.get("namespace") == namespace
        for s in binding.get("subjects") or []
    )


def _matches(rule: dict, call: Call) -> bool:
    def has(values, value):
        return "*" in (values or []) or value in (values or [])

    names = rule.get("resourceNames")
    return (
        has(rule.get("apiGroups"), call.group)
        and has(rule.get("resources"), call.resource)
        and has(rule.get("verbs"), call.verb)
        and (not names or call.name in names)
    )


@dataclass(frozen=True)
class Grants:
    cluster: tuple[dict, ...]  # rules bound cluster-wide
    namespaced: dict[str, tuple[dict, ...]]  # rules bound in one namespace

    @classmethod
    def of(cls, docs, service_account: str, release_namespace: str) -> "Grants":
        # An object the chart leaves without a namespace is installed into the release's.
        roles = {
            (d["kind"], d["metadata"].get("namespace", release_namespace), d["metadata"]["name"])
            if d["kind"] == "Role"
            else (d["kind"], None, d["metadata"]["name"]): d
            for d in docs
            if d["kind"] in ("Role", "ClusterRole")
        }
        cluster, namespaced = [], {}
        for doc in docs:
            if doc["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            if not _bound(doc, service_account, release_namespace):
                continue
            ref = doc["roleRef"]
            namespace = doc["metadata"].get("namespace", release_namespace)
            key = (ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])
            rules = roles[key].get("rules") or []
            if doc["kind"] == "ClusterRoleBinding":
                cluster += rules
            else:
                namespaced.setdefault(namespace, []).extend(rules)
        return cls(tuple(cluster), {ns: tuple(rules) for ns, rules in namespaced.items()})

    def allows(self, call: Call) -> bool:
        rules = list(self.cluster)
        if call.namespace is not None:
            rules += self.namespaced.get(call.namespace, ())
        return any(_matches(rule, call) for rule in rules)

    def refused(self, calls: set[Call]) -> list[str]:
        return sorted(str(call) for call in calls if not self.allows(call))
