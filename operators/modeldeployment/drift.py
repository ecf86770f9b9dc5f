"""When an owned engine Deployment changes outside the operator, put it back.

kopf delivers every event of the Deployments labelled as a ModelDeployment's;
DriftWatch picks the ones worth a repair: a delete, or a change of the
Deployment's spec (its generation), labels or owner. Status updates (several
a second while pods start) and the events the operator's own apply causes
are not drift: the first are filtered here, the second end in an apply that
changes nothing and so posts nothing.

A repair applies the ModelDeployment's objects again (reconcile.py); an
apply the API server refuses for a while (409, 429, 5xx, a dropped
connection) is retried with jittered exponential backoff, so operators
restarted together do not retry in step. Its outcome becomes the Synced
condition and, when something changed, a DriftRepaired or Recreated Event.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx2
from lightkube import ApiError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from maas_operator.modeldeployment.crd_schema import KIND
from maas_operator.modeldeployment.status import Condition

# How long one repair keeps trying before it reports RepairFailed; the
# autoscaler's timer tries again after that for a Deployment that is gone.
REPAIR_SECONDS = 120.0

Event = tuple[str, str, str]  # (type, reason, message)


def transient(exc: BaseException) -> bool:
    """An answer worth trying again: a conflict, throttling, a server error, no answer."""
    if isinstance(exc, ApiError):
        return exc.status.code in (409, 429) or exc.status.code >= 500
    return isinstance(exc, httpx2.TransportError)


@dataclass(frozen=True)
class Repair:
    """The Synced verdict of the last apply, and the Events to post for it."""

    status: bool
    reason: str
    message: str
    events: tuple[Event, ...] = ()

    @classmethod
    def applied(cls) -> "Repair":
        return cls(True, "Applied", "every owned object matches the spec")


def synced(repair: Repair | None) -> list[Condition]:
    if repair is None:
        return []
    return [Condition("Synced", repair.status, repair.reason, repair.message)]


def _controller_uid(body: dict) -> str | None:
    for ref in body["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            return ref.get("uid")
    return None


@dataclass
class DriftWatch:
    # Deployment uid -> what was last seen of it that a repair would restore.
    _seen: dict[str, str] = field(default_factory=dict)

    def owner_to_repair(self, event_type: str | None, body: dict) -> str | None:
        """The owning ModelDeployment's uid when this event is drift, else None."""
        meta = body["metadata"]
        owner = _controller_uid(body)
        if owner is None:
            return None
        if event_type == "DELETED":
            self._seen.pop(meta["uid"], None)
            return owner
        mark = json.dumps(
            [meta.get("generation"), meta.get("labels"), meta.get("ownerReferences")],
            sort_keys=True,
        )
        previous, self._seen[meta["uid"]] = self._seen.get(meta["uid"]), mark
        # None: kopf listing what exists; ADDED: a creation, the operator's own.
        if event_type in (None, "ADDED") or previous == mark:
            return None
        return owner

    async def repaired(self, apply: Callable[[], Awaitable[dict[str, str]]]) -> Repair | None:
        """Apply until the API server takes it; None when nothing had drifted."""
        try:
            async for attempt in AsyncRetrying(
                wait=wait_exponential_jitter(multiplier=0.2, max=10.0, jitter=0.5),
                stop=stop_after_delay(REPAIR_SECONDS),
                retry=retry_if_exception(transient),
                reraise=True,
            ):
                with attempt:
                    outcomes = await apply()
        except (ApiError, httpx2.HTTPError) as exc:
            message = f"could not apply the owned objects again: {exc}"[:500]
            return Repair(False, "RepairFailed", message, (("Warning", "RepairFailed", message),))
        events = [
            (
                "Warning",
                "Recreated" if outcome == "created" else "DriftRepaired",
                f"{name} was {'deleted' if outcome == 'created' else 'changed'} outside the "
                f"operator; {outcome} from the spec",
            )
            for name, outcome in sorted(outcomes.items())
            if outcome in ("created", "updated")
        ]
        if not events:
            return None
        reason = "Recreated" if any(e[1] == "Recreated" for e in events) else "DriftRepaired"
        return Repair(True, reason, "; ".join(e[2] for e in events), tuple(events))
