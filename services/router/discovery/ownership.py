"""Which engine Services the router may pool: those the operator made for that model.

A label is no proof: anyone who may create a Service in a watched namespace
can label it `maas.io/model: X`, and RBAC cannot reserve a label. Pooling it
would send tenants' prompts, and the service token every call carries, to
whatever it selects. So a Service is pooled only when its controller
ownerReference resolves, by UID, to a ModelDeployment (maas.io) in the
Service's own namespace (owner references never cross one) that the router
watches, whose claimed model ids (maas_services.common.model_claims) include the
Service's model label, and which no earlier ModelDeployment beat to one of
those ids. Creating a ModelDeployment is the right that makes an engine
trusted; making one is the operator's job.

Every other Service labelled as an engine is left out, logged once and
counted in `maas_router_engine_services_refused_total{reason}`.
"""

from dataclasses import dataclass, field

from prometheus_client import Counter

from maas_services.common.logging import get_logger
from maas_services.common.model_claims import Claimant, conflicts
from maas_services.router.discovery.kubernetes_objects import MODEL_LABEL

log = get_logger(__name__)

GROUP = "maas.io"
KIND = "ModelDeployment"

REFUSED = Counter(
    "maas_router_engine_services_refused",
    "Services labelled as engines that the router does not pool, counted once each",
    ["reason"],
)


def _owner_uid(service: dict) -> str | None:
    """The UID of the ModelDeployment that controls this Service, if one does."""
    for ref in (service.get("metadata") or {}).get("ownerReferences") or []:
        group = (ref.get("apiVersion") or "").partition("/")[0]
        if ref.get("controller") and group == GROUP and ref.get("kind") == KIND:
            return ref.get("uid")
    return None


def refusal(service: dict, owners: dict[str, Claimant], conflicted: set[str]) -> str | None:
    """Why this Service may not be pooled, or None. owners: watched ModelDeployments by UID."""
    meta = service["metadata"]
    uid = _owner_uid(service)
    if uid is None:
        return "unowned"
    owner = owners.get(uid)
    if owner is None or owner.namespace != meta.get("namespace", ""):
        return "owner_not_found"
    if ((meta.get("labels") or {}).get(MODEL_LABEL)) not in owner.ids:
        return "other_model"
    if uid in conflicted:
        return "model_id_conflict"
    return None


@dataclass
class OwnerCheck:
    """Filters engine Services by their owner; remembers what it already reported."""

    _reported: set[tuple[str, str, str, str]] = field(default_factory=set)

    def pooled(self, services: list[dict], deployments: list[dict]) -> list[dict]:
        claimants = [Claimant.of(d) for d in deployments]
        owners = {c.uid: c for c in claimants}
        conflicted = set(conflicts(claimants))
        kept = []
        for service in services:
            if not (service["metadata"].get("labels") or {}).get(MODEL_LABEL):
                continue  # not labelled as any model's engine: nothing to pool or report
            reason = refusal(service, owners, conflicted)
            if reason is None:
                kept.append(service)
            else:
                self._report(service, reason)
        return kept

    def _report(self, service: dict, reason: str) -> None:
        meta = service["metadata"]
        key = (meta.get("namespace", ""), meta["name"], meta.get("uid", ""), reason)
        if key in self._reported:
            return
        self._reported.add(key)
        REFUSED.labels(reason=reason).inc()
        log.warning(
            "engine_service_refused",
            namespace=key[0],
            service=key[1],
            model=(meta.get("labels") or {}).get(MODEL_LABEL, ""),
            reason=reason,
        )
