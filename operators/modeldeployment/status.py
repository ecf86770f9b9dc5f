"""Status conditions of a ModelDeployment: the autoscaler's, from one tick, and Ready."""

from dataclasses import dataclass
from datetime import UTC, datetime


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
    available = ready >= max(min_replicas, 1)
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
            "MinimumReplicasReady" if available else "MinimumReplicasUnavailable",
            f"{ready} ready, at least {max(min_replicas, 1)} needed",
        ),
        Condition("Progressing", not settled, *progressing),
        Condition(
            "ScalingLimited",
            bool(limited_reason),
            limited_reason or "WithinBounds",
            limited_message or "the autoscaler is free to act",
        ),
    ]


def merge_conditions(
    previous: list[dict], current: list[Condition], generation: int, now: float
) -> list[dict]:
    """Conditions as status dicts; lastTransitionTime moves only when status flips.

    Conditions of other types are kept as they were: the autoscaler and the
    spec handler (Ready) each own some of them.
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
