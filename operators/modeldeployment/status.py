"""Status conditions of a ModelDeployment: the autoscaler's, ModelIdConflict and Ready.

Ready is the summary: False with the admission policy's reason when the spec
is refused, False with ModelIdConflict when an earlier ModelDeployment holds
its model id (maas_services.common.model_claims: its engines run, but the router
pools none of them), else whether Available is. Both the spec handler and the
autoscaler write it, each from the spec in the body it was given, because a
status patch replaces the whole list: a writer that left Ready out would
drop it, and one that kept an older body's Ready would bring it back. The
autoscaler ticks on, so the latest spec's verdict is the one that stays.
"""

from dataclasses import dataclass
from datetime import UTC, datetime

from maas_operator.modeldeployment.admission import Refusal
from maas_services.common.model_claims import Conflict


def timestamp(epoch: float) -> str:
    """RFC 3339 in UTC, to the millisecond: cooldowns are seconds long."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_timestamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def conditions(
    *,
    ready: int,
    replicas: int,
    desired: int,
    min_replicas: int,
    draining: bool,
    limited_reason: str,
    limited_message: str,
) -> list[Condition]:
    # At zero on purpose the model is still served: the gateway holds its requests.
    scaled_to_zero = min_replicas == 0 and desired == 0 and not draining
    available = ready >= max(min_replicas, 1) or scaled_to_zero
    settled = ready == desired == replicas and not draining
    if draining:
        progressing = ("Draining", "a replica is finishing its requests before removal")
    elif not settled:
        progressing = ("Scaling", f"{ready} of {desired} replicas ready, {replicas} exist")
    else:
        progressing = ("Stable", f"{ready} replicas ready")
    return [
        Condition(
            "Available",
            available,
            "ScaledToZero"
            if scaled_to_zero
            else ("MinimumReplicasReady" if available else "MinimumReplicasUnavailable"),
            "no replica runs; requests are held while one starts"
            if scaled_to_zero
            else f"{ready} ready, at least {max(min_replicas, 1)} needed",
        ),
        Condition("Progressing", not settled, *progressing),
        Condition(
            "ScalingLimited",
            bool(limited_reason),
            limited_reason or "WithinBounds",
            limited_message or "the autoscaler is free to act",
        ),
    ]


def conflict_refusal(conflict: Conflict | None) -> Refusal | None:
    if conflict is None:
        return None
    return Refusal(
        "ModelIdConflict",
        f"model id {conflict.model!r} belongs to ModelDeployment {conflict.holder}, made "
        "earlier; the router routes none of this one's engines until that one is gone",
    )


def model_id_conflict(conflict: Conflict | None) -> Condition:
    refusal = conflict_refusal(conflict)
    if refusal is None:
        return Condition("ModelIdConflict", False, "Unique", "no earlier deployment has the id")
    return Condition("ModelIdConflict", True, refusal.reason, refusal.message)


def ready(refusal: Refusal | None, available: bool | None) -> Condition:
    """available is None before the autoscaler has looked at the replicas."""
    if refusal is not None:
        return Condition("Ready", False, refusal.reason, refusal.message)
    if available is None:
        return Condition("Ready", False, "Reconciling", "the engine objects match the spec")
    if available:
        return Condition("Ready", True, "MinimumReplicasReady", "the spec is served")
    return Condition("Ready", False, "MinimumReplicasUnavailable", "see the Available condition")


def merge_conditions(
    previous: list[dict], current: list[Condition], generation: int, now: float
) -> list[dict]:
    """Conditions as status dicts; lastTransitionTime moves only when status flips.

    Conditions of other types are kept as they were: the spec handler writes
    only Ready.
    """
    before = {c.get("type"): c for c in previous or []}
    updated = {cond.type for cond in current}
    merged = [c for c in previous or [] if c.get("type") not in updated]
    for cond in current:
        status = "True" if cond.status else "False"
        old = before.get(cond.type)
        changed = old is None or old.get("status") != status
        merged.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": timestamp(now) if changed else old["lastTransitionTime"],
                "observedGeneration": generation,
            }
        )
    return merged
