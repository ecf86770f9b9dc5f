"""Which PersistentVolumeClaims a `pvc://` model source may mount: those labelled for models.

The operator mounts the claim into engine pods with its own rights, so
without a check whoever may write a ModelDeployment could mount any claim of
the namespace (another team's data, a database's volume) into a container
that serves it to tenants through the model's outputs, or read it through
vLLM's file loading. A claim is a model store when its owner says so with the
label `maas.io/model-store: "true"`; the operator reads the claim before it
creates anything and refuses a spec naming any other (Ready=False,
ClaimNotAllowed / ClaimNotFound), as it refuses a disallowed image. Labelling a
claim is a right over that claim, held by whoever may update it.

The check runs at every reconcile and autoscaler tick, and a refused spec is
looked at again every six autoscaler intervals (30 s by default), so labelling
the claim is enough to start it; a label removed later stops the next rollout (pods already running
keep their mount until replaced). An adapter's pvc:// source (spec.adapters)
is held to the same rule.
"""

from urllib.parse import urlparse

from maas_operator.modeldeployment.admission import Refusal
from maas_operator.modeldeployment.kube import KubeApi

STORE_LABEL = "maas.io/model-store"
CLAIM_REASONS = ("ClaimNotFound", "ClaimNotAllowed")


async def claim_refusal(api: KubeApi, namespace: str, spec: dict) -> Refusal | None:
    """Why one of spec's pvc:// sources may not be mounted, or None (also for other sources)."""
    sources = {
        "spec.model.source.uri": (spec["model"].get("source") or {}).get("uri") or "",
        **{
            f"spec.adapters[{i}].source.uri": a["source"]["uri"]
            for i, a in enumerate(spec.get("adapters") or [])
        },
    }
    # One look per claim: adapters often share the model's store.
    checked: set[str] = set()
    for field, uri in sources.items():
        parsed = urlparse(uri)
        if parsed.scheme != "pvc" or parsed.netloc in checked:
            continue
        checked.add(parsed.netloc)
        refusal = await _claim_refusal(api, namespace, field, uri, parsed.netloc)
        if refusal is not None:
            return refusal
    return None


async def _claim_refusal(
    api: KubeApi, namespace: str, field: str, uri: str, claim: str
) -> Refusal | None:
    found = await api.get("PersistentVolumeClaim", namespace, claim)
    if found is None:
        return Refusal(
            "ClaimNotFound",
            f"{field} {uri!r}: no PersistentVolumeClaim {claim!r} in {namespace}",
        )
    if (found["metadata"].get("labels") or {}).get(STORE_LABEL) != "true":
        return Refusal(
            "ClaimNotAllowed",
            f"{field} {uri!r}: PersistentVolumeClaim {claim!r} is not labelled "
            f'{STORE_LABEL}="true"; only claims labelled as model stores are mounted',
        )
    return None
